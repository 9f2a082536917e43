//! `redrive bench console`: the console's two figures of issue 16 on a large store.
//!
//! 1. **List latency**: seeds a realistic store (see [`seed`]), serves the same router
//!    `redrive run` serves on its admin listener (the API and the console, with a
//!    token), signs in to the console like a browser, and times over HTTP the task list
//!    page and `GET /api/v1/tasks` for several filters: p50, p95 and p99 per query.
//! 2. **Bulk action beside a drain** ([`super::bulk`]): a bulk action by filter over a
//!    large selection through the operations layer, its progress printed, while a fleet
//!    drains a backlog of its own; the drain rate with and without it.
//!
//! Each part ends by checking that every task it created is in the state it should be,
//! and fails otherwise.

use clap::Args;
use secrecy::SecretString;
use std::time::{Duration, Instant};

use super::served::{serve_console, Browser, TOKEN};
use super::{drop_schema, fresh_store};
use crate::config::{AdminToken, Role, Settings};
use crate::output::outln;
use crate::store::Store;

/// Options of `redrive bench console`.
#[derive(Debug, Clone, Args)]
pub struct ConsoleBenchOptions {
    /// Tasks in the store the list pages are timed on.
    #[arg(long, default_value_t = 1_000_000, value_parser = super::at_least_one())]
    pub tasks: usize,
    /// Timed requests per query (after the warm-up).
    #[arg(long, default_value_t = 200, value_parser = super::at_least_one())]
    pub requests: usize,
    /// Untimed requests per query first.
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// Time the queries once more after `VACUUM (ANALYZE)`, the table as autovacuum keeps
    /// it: statistics, and a visibility map that lets an index answer alone (the first
    /// round runs as seeded: no statistics, every page still to check, as right after a
    /// burst).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub analyze: bool,
    /// Options of the bulk action beside a drain.
    #[command(flatten)]
    pub bulk: super::bulk::BulkBenchOptions,
    /// Length of each window of the drain beside the console (alternately alone and
    /// beside it; `--rounds` sets how many).
    #[arg(long, default_value = "10s", value_parser = super::length_of_time)]
    pub drain_window: Duration,
    /// Only the "what broke" figures: groups and search latency, and the drain beside an
    /// operator grouping and searching (no list latency, no bulk action).
    #[arg(long)]
    pub what_broke_only: bool,
}

/// One timed query: its name and the query string it sends.
struct Query {
    name: &'static str,
    query: String,
}

/// The queries timed on a store of `tasks` tasks (ids 1 to `tasks`).
fn queries(tasks: usize) -> Vec<Query> {
    let near_end = (tasks as i64 / 100).max(2);
    let q = |name, query: &str| Query {
        name,
        query: query.to_owned(),
    };
    vec![
        q("unfiltered", ""),
        q("status=failed", "status=failed"),
        q("handler=payments", "handler=payments"),
        q("status=permanent_failure", "status=permanent_failure"),
        q(
            "old incident: status=permanent_failure&handler=billing",
            "status=permanent_failure&handler=billing",
        ),
        q(
            "old incident: status=discarded,failed&handler=billing",
            "status=discarded,failed&handler=billing",
        ),
        q("old incident: handler=billing", "handler=billing"),
        q("error=deserialization", "error=deserialization"),
        q("key_prefix=customer-4242:", "key_prefix=customer-4242%3A"),
        q("created_after=1h", "created_after=1h"),
        Query {
            name: "after=<1% from the end>",
            query: format!("after={near_end}"),
        },
    ]
}

/// Latency percentiles of one query, in milliseconds.
struct Latency {
    p50: f64,
    p95: f64,
    p99: f64,
}

/// The value at `share` (0 to 1) of sorted `values`, nearest rank.
fn percentile(sorted: &[f64], share: f64) -> f64 {
    let rank = (share * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs the benchmark and prints its figures.
pub async fn run(settings: &Settings, options: &ConsoleBenchOptions) -> anyhow::Result<()> {
    let mut settings = settings.clone();
    settings.admin.tokens.insert(
        "bench".into(),
        AdminToken {
            role: Role::Operate,
            token: SecretString::from(TOKEN),
        },
    );
    let store = fresh_store(&settings).await?;
    let started = Instant::now();
    let seeded = seed(&store, options.tasks).await?;
    outln!(
        "redrive bench console: {} tasks seeded in {:.0} s ({} failed, {} due now, {} resolved, \
         {} permanent_failure, {} discarded; 5 handlers, 3 routes, created over 30 days)",
        options.tasks,
        started.elapsed().as_secs_f64(),
        seeded.failed,
        seeded.due,
        seeded.resolved,
        seeded.permanent_failure,
        seeded.discarded
    );
    let last_seeded: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM recovery_task")
        .fetch_one(store.pool())
        .await?;
    let (browser, stop, serving) = serve_console(&settings).await?;
    list_latency(&browser, &store, options).await?;
    let resolved = super::broke::drain_beside_console(
        &settings,
        &store,
        &browser,
        options.bulk.drain_tasks,
        options.bulk.rounds,
        options.drain_window,
    )
    .await;
    stop.cancel();
    serving.await?;
    let resolved = resolved?;
    super::broke::check_drained(&store, last_seeded, resolved).await?;
    // The drained tasks go, so that the seeded store can be checked as it was: they
    // came after the seeded ones, so by id (by handler, it read every task of a 10M
    // store for minutes).
    for statement in [
        "DELETE FROM recovery_attempt WHERE task_id > $1",
        "DELETE FROM recovery_task WHERE id > $1 AND handler = 'noop'",
    ] {
        sqlx::query(statement)
            .bind(last_seeded)
            .execute(store.pool())
            .await?;
    }
    verify_seed(&store, &seeded).await?;
    drop_schema(&store).await?;
    if options.what_broke_only {
        return Ok(());
    }
    super::bulk::run(&settings, &options.bulk).await
}

/// Times every query on the console and the API, as seeded and (with `analyze`) after
/// `VACUUM (ANALYZE)`.
async fn list_latency(
    browser: &Browser,
    store: &Store,
    options: &ConsoleBenchOptions,
) -> anyhow::Result<()> {
    let Browser {
        client,
        base,
        cookie,
    } = browser;
    let rounds: &[bool] = if options.analyze {
        &[false, true]
    } else {
        &[false]
    };
    for &analyzed in rounds {
        if analyzed {
            sqlx::query("VACUUM (ANALYZE) recovery_task")
                .execute(store.pool())
                .await?;
            outln!("after VACUUM (ANALYZE), as autovacuum keeps the table:");
        }
        if !options.what_broke_only {
            list_round(client, base, cookie, options, analyzed).await?;
        }
        what_broke_latency(client, base, options, analyzed).await?;
    }
    Ok(())
}

/// Times every list query on the console and the API, once.
async fn list_round(
    client: &reqwest::Client,
    base: &str,
    cookie: &str,
    options: &ConsoleBenchOptions,
    analyzed: bool,
) -> anyhow::Result<()> {
    outln!(
        "list latency over HTTP, {} requests per query after {} warm-up, {}:",
        options.requests,
        options.warmup,
        if analyzed {
            "after VACUUM (ANALYZE)"
        } else {
            "as seeded: no statistics, every page still to check"
        }
    );
    outln!(
        "  {:<8} {:<28} {:>8} {:>8} {:>8}",
        "face",
        "query",
        "p50 ms",
        "p95 ms",
        "p99 ms"
    );
    let mut misses = Vec::new();
    for query in queries(options.tasks) {
        for (face, path, auth) in [
            ("console", "/console/tasks", ("cookie", cookie.to_owned())),
            (
                "api",
                "/api/v1/tasks",
                ("authorization", format!("Bearer {TOKEN}")),
            ),
        ] {
            let url = format!("{base}{path}?{}", query.query);
            let latency = time_requests(client, &url, auth, options).await?;
            outln!(
                "  {:<8} {:<28} {:>8.1} {:>8.1} {:>8.1}",
                face,
                query.name,
                latency.p50,
                latency.p95,
                latency.p99
            );
            if latency.p95 > 200.0 {
                misses.push(format!("{face} {}", query.name));
            }
        }
    }
    match misses.is_empty() {
        true => outln!("  every query answered within 200 ms at p95"),
        false => outln!("  over 200 ms at p95: {}", misses.join(", ")),
    }
    Ok(())
}

/// The groups and search requests timed: (name, path and query).
const QUERIES: [(&str, &str); 7] = [
    ("groups (what broke)", "/api/v1/groups"),
    ("groups by class", "/api/v1/groups?by=class"),
    ("groups since=1h", "/api/v1/groups?since=1h"),
    (
        "groups handler=billing",
        "/api/v1/groups?handler=billing&status=permanent_failure",
    ),
    ("groups by handler", "/api/v1/groups?by=handler"),
    (
        "search a key",
        "/api/v1/tasks?search=customer-4242%3Aorder-",
    ),
    ("search, no match", "/api/v1/tasks?search=no-such-text"),
];

/// Times [`QUERIES`] over HTTP at `base`.
async fn what_broke_latency(
    client: &reqwest::Client,
    base: &str,
    options: &ConsoleBenchOptions,
    analyzed: bool,
) -> anyhow::Result<()> {
    outln!(
        "what broke over HTTP (the API), {} requests per query, {}:",
        options.requests,
        if analyzed {
            "after VACUUM (ANALYZE)"
        } else {
            "as seeded: no statistics, every page still to check"
        }
    );
    outln!(
        "  {:<28} {:>8} {:>8} {:>8}",
        "query",
        "p50 ms",
        "p95 ms",
        "p99 ms"
    );
    for (name, path) in QUERIES {
        let url = format!("{base}{path}");
        let auth = ("authorization", format!("Bearer {TOKEN}"));
        match time_requests(client, &url, auth, options).await {
            Ok(latency) => outln!(
                "  {:<28} {:>8.1} {:>8.1} {:>8.1}",
                name,
                latency.p50,
                latency.p95,
                latency.p99
            ),
            // A grouping that reads every task may outlast the statement timeout on a
            // large store: a figure too, not the end of the run.
            Err(error) if error.to_string().contains("504") => {
                outln!("  {name:<28} timed out (504: the grouping's 10 s statement timeout)")
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Sends `options.warmup` then `options.requests` GETs of `url` one after another, each
/// read whole, required to answer 200 and asking not to be answered from a shared
/// count (`Cache-Control: no-cache`); answers the timed ones' percentiles.
async fn time_requests(
    client: &reqwest::Client,
    url: &str,
    (header, value): (&str, String),
    options: &ConsoleBenchOptions,
) -> anyhow::Result<Latency> {
    let mut times = Vec::with_capacity(options.requests);
    for i in 0..options.warmup + options.requests {
        let started = Instant::now();
        // Counted every time: a grouping shared between callers would time nothing.
        let response = (client.get(url).header(header, &value))
            .header("cache-control", "no-cache")
            .send()
            .await?;
        let status = response.status();
        let body = response.bytes().await?;
        anyhow::ensure!(
            status == reqwest::StatusCode::OK,
            "GET {url} answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
        if i >= options.warmup {
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(Latency {
        p50: percentile(&times, 0.50),
        p95: percentile(&times, 0.95),
        p99: percentile(&times, 0.99),
    })
}

/// How many tasks of each kind the seeding wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
struct Seeded {
    failed: i64,
    due: i64,
    resolved: i64,
    permanent_failure: i64,
    discarded: i64,
}

/// What the seeding writes, by SQL: task `i` of `$1`, created `30 days * ($1 - i) / $1`
/// ago (ids in creation order), of handler `i % 5` (but `billing` for the oldest 1%: an
/// incident of a month ago, found only far down the newest-first order) and route
/// `i % 3`, keyed
/// `customer-<c>:order-<i>` (50,000 customers); 80% resolved, 7% discarded, 5%
/// permanent_failure, 8% failed (half of them due now, the rest within a day). Every
/// task carries the error its consumer reported (five kinds, from 40% down to 2%, in
/// bursts of 1,000 consecutive tasks, as incidents come); unfinished and given-up tasks
/// also a last error.
const SEED: &str = r#"
INSERT INTO recovery_task (dedup_key, handler, route, source_topic, source_partition, source_offset,
    msg_key, msg_value, error_class, error_message, status, attempts, next_attempt_at, last_error,
    created_at, updated_at, finished_at, cause_id, cause_at)
SELECT 'kafka:' || topic || ':' || (i % 12) || ':' || i, handler, route, topic, i % 12, i,
       convert_to('customer-' || ((i * 7919) % 50000) || ':order-' || i, 'UTF8'),
       convert_to('{"order":' || i || ',"lines":"' || repeat('x', 200) || '"}', 'UTF8'),
       'java.lang.RuntimeException', error, status,
       CASE status WHEN 'failed' THEN i % 4 WHEN 'permanent_failure' THEN 5 ELSE 1 + i % 3 END,
       CASE WHEN status <> 'failed' THEN created
            WHEN i % 2 = 0 THEN now() - (i % 600) * interval '1 second'
            ELSE now() + (i % 1440) * interval '1 minute' END,
       CASE WHEN status = 'resolved' THEN NULL ELSE error END,
       created, created + interval '2 minutes',
       CASE WHEN status = 'failed' THEN NULL ELSE created + interval '2 minutes' END,
       cause, created + interval '2 minutes'
FROM (
    SELECT i,
           now() - ($1 - i) * interval '30 days' / $1 AS created,
           CASE WHEN i <= $1 / 100 THEN 'billing'
                ELSE (ARRAY['orders', 'payments', 'emails', 'inventory', 'search-index'])[1 + i % 5]
           END AS handler,
           (ARRAY['orders-dlt', 'payments-dlt', 'misc-dlt'])[1 + i % 3] AS route,
           (ARRAY['orders', 'payments', 'events'])[1 + i % 3] AS topic,
           CASE WHEN i % 100 < 80 THEN 'resolved' WHEN i % 100 < 87 THEN 'discarded'
                WHEN i % 100 < 92 THEN 'permanent_failure' ELSE 'failed' END AS status,
           CASE WHEN (i / 1000 * 7) % 50 < 20 THEN 'java.net.SocketTimeoutException: Read timed out'
                WHEN (i / 1000 * 7) % 50 < 35 THEN 'java.net.ConnectException: Connection refused'
                WHEN (i / 1000 * 7) % 50 < 45 THEN 'HTTP 503 Service Unavailable from inventory-api'
                WHEN (i / 1000 * 7) % 50 < 49 THEN 'validation failed: missing field customer_id'
                ELSE 'deserialization failed: unexpected end of JSON input at line 1' END AS error,
           CASE WHEN (i / 1000 * 7) % 50 < 20 THEN 1 WHEN (i / 1000 * 7) % 50 < 35 THEN 2
                WHEN (i / 1000 * 7) % 50 < 45 THEN 3 WHEN (i / 1000 * 7) % 50 < 49 THEN 4
                ELSE 5 END AS cause
    FROM generate_series(1, $1::bigint) i) s
"#;

/// Seeds `tasks` tasks ([`SEED`], one statement) without `ANALYZE`; answers
/// what it wrote, as counted by the seed's own rules.
async fn seed(store: &Store, tasks: usize) -> anyhow::Result<Seeded> {
    // The five causes the seeded errors have (ids 1 to 5, in SEED's order).
    sqlx::query(
        "INSERT INTO recovery_cause (id, class, fingerprint, example, first_seen) OVERRIDING SYSTEM VALUE \
         SELECT i, c, f, f, now() - interval '30 days' FROM unnest($1::text[], $2::text[]) \
             WITH ORDINALITY AS u(c, f, i)",
    )
    .bind(["java.net.SocketTimeoutException", "java.net.ConnectException", "http.5xx",
           "handler.permanent", "handler.permanent"])
    .bind(["java.net.SocketTimeoutException: Read timed out",
           "java.net.ConnectException: Connection refused",
           "HTTP <n> Service Unavailable from inventory-api",
           "validation failed: missing field customer_id",
           "deserialization failed: unexpected end of JSON input at line <n>"])
    .execute(store.pool())
    .await?;
    sqlx::query(SEED)
        .bind(tasks as i64)
        .execute(store.pool())
        .await?;
    Ok(sqlx::query_as(
        "SELECT count(*) FILTER (WHERE i % 100 >= 92) AS failed,
                count(*) FILTER (WHERE i % 100 >= 92 AND i % 2 = 0) AS due,
                count(*) FILTER (WHERE i % 100 < 80) AS resolved,
                count(*) FILTER (WHERE i % 100 >= 87 AND i % 100 < 92) AS permanent_failure,
                count(*) FILTER (WHERE i % 100 >= 80 AND i % 100 < 87) AS discarded
         FROM generate_series(1, $1::bigint) i",
    )
    .bind(tasks as i64)
    .fetch_one(store.pool())
    .await?)
}

/// Fails unless the store holds exactly the seeded tasks, each in its seeded status (the
/// list pages changed nothing).
async fn verify_seed(store: &Store, seeded: &Seeded) -> anyhow::Result<()> {
    let found: Seeded = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'failed') AS failed,
                count(*) FILTER (WHERE status = 'failed' AND source_offset % 2 = 0) AS due,
                count(*) FILTER (WHERE status = 'resolved') AS resolved,
                count(*) FILTER (WHERE status = 'permanent_failure') AS permanent_failure,
                count(*) FILTER (WHERE status = 'discarded') AS discarded
         FROM recovery_task
         WHERE status = CASE WHEN source_offset % 100 < 80 THEN 'resolved'
                             WHEN source_offset % 100 < 87 THEN 'discarded'
                             WHEN source_offset % 100 < 92 THEN 'permanent_failure'
                             ELSE 'failed' END",
    )
    .fetch_one(store.pool())
    .await?;
    anyhow::ensure!(
        found == *seeded,
        "the store does not hold the seeded tasks: seeded {seeded:?}, found {found:?}"
    );
    let (total, attempts): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM recovery_task), (SELECT count(*) FROM recovery_attempt)",
    )
    .fetch_one(store.pool())
    .await?;
    let expected = seeded.failed + seeded.resolved + seeded.permanent_failure + seeded.discarded;
    anyhow::ensure!(
        total == expected && attempts == 0,
        "{total} tasks ({expected} seeded) and {attempts} history rows (none expected)"
    );
    outln!("  checked: the {total} seeded tasks are each in their seeded status");
    Ok(())
}

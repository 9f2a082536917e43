//! Upgrading a store: `redrive migrate` says which migrations it applied, a schema a
//! newer release migrated is refused by name and version, and a member started with
//! migrations off waits for them, saying so once.

use std::time::Duration;

use crate::support::cli::run;
use crate::support::{eventually, fresh_store, settings, unique_schema, Spawn};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A version no release has: a newer release's migration, as far as this one knows.
const FUTURE: i64 = 29_991_231_000_000;

/// `redrive migrate` printed "up to date" whatever it did; an older binary on a newer
/// schema failed with sqlx's "previously applied but is missing".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_names_what_it_applied_and_refuses_a_schema_a_newer_release_migrated() {
    let (store, _) = fresh_store().await;
    let settings = settings(&unique_schema());
    let latest = redrive::store::SchemaVersions::binary_latest().to_string();

    let out = run(&settings, &["migrate"]);
    let first = text(&out.stdout);
    assert!(out.status.success(), "{first}{}", text(&out.stderr));
    assert!(
        first.contains("applied ") && first.contains(&latest),
        "{first}"
    );
    assert!(
        first.contains("task disposition"),
        "each one by name: {first}"
    );
    assert!(
        !text(&out.stderr).contains("already exists"),
        "{}",
        text(&out.stderr)
    );

    let out = run(&settings, &["migrate"]);
    let again = text(&out.stdout);
    assert!(out.status.success(), "{again}");
    assert!(
        again.contains("up to date") && again.contains("none was pending"),
        "{again}"
    );

    sqlx::query(&format!(
        "INSERT INTO {}._sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, 'from a newer release', true, '\\x00'::bytea, 0)",
        settings.database.schema
    ))
    .bind(FUTURE)
    .execute(store.pool())
    .await
    .unwrap();
    let out = run(&settings, &["migrate"]);
    let refused = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        refused.contains(&FUTURE.to_string()) && refused.contains(&latest),
        "both versions: {refused}"
    );
    assert!(refused.contains("newer release"), "{refused}");
    // The operator verbs read such a schema as they would a current one.
    let out = run(&settings, &["tasks", "list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `run --no-migrate` before the migrations had run logged "relation … does not exist"
/// every few seconds: it says once that it waits for `redrive migrate`, then starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_migrations_on_start_waits_for_migrate_and_says_so_once() {
    let _ = fresh_store().await;
    let settings = settings(&unique_schema());
    let mut member = Spawn::binary(&settings)
        .env("REDRIVE__DATABASE__MIGRATE_ON_START", "false")
        .start();
    eventually(Duration::from_secs(30), "it says it waits", || async {
        !member.log_lines("waiting for `redrive migrate`").is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        member.log_lines("waiting for `redrive migrate`").len(),
        1,
        "{}",
        member.log_tail()
    );
    assert!(
        member.log_lines("does not exist").is_empty(),
        "{}",
        member.log_tail()
    );
    let out = run(&settings, &["migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    eventually(
        Duration::from_secs(20),
        "it starts once migrated",
        || async { !member.log_lines("worker pool started").is_empty() },
    )
    .await;
    member.stop(Duration::from_secs(20)).await;
}

/// Found by the upgrade rehearsal: once a migration added a column to the task table,
/// every running member failed every claim ("cached plan must not change result type":
/// its prepared statements returned `t.*`) until its connections were replaced. Every
/// statement that reads whole tasks works on across a column added under it, on the
/// connection that prepared it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_that_read_tasks_work_on_when_a_column_is_added_to_the_task_table() {
    let (store, mut settings) = fresh_store().await;
    // One connection: each statement is prepared on it before the column is added.
    settings.database.max_connections = 1;
    let member = redrive::Store::connect(&settings.database).await.unwrap();
    let handlers = ["log".to_owned()];
    let read_everything = || {
        let member = member.clone();
        let handlers = handlers.clone();
        async move {
            let key = format!("k{}", rand::random::<u64>()).into_bytes();
            let task = redrive::NewTask {
                order_key: Some(key.clone()),
                ..redrive::NewTask::new("log", "v")
            };
            member.enqueue_many(&[task]).await?;
            let claimed = member
                .claim(&handlers, 10, "w", Duration::from_secs(30))
                .await?;
            let id = claimed[0].id;
            member.get(id).await?;
            member.detail(id).await?;
            member
                .newest_ordered_tasks(&[(key, String::new(), 0)])
                .await?;
            Ok::<_, redrive::StoreError>(())
        }
    };
    read_everything().await.unwrap();
    read_everything().await.unwrap();
    // What the next release's migration may do.
    sqlx::query("ALTER TABLE recovery_task ADD COLUMN added_by_a_later_release text")
        .execute(store.pool())
        .await
        .unwrap();
    read_everything()
        .await
        .expect("the statements prepared before the column was added");
}

//! `redrive tasks transform`: a dry run first (what it would change, fail on and leave
//! alone, with a diff of a few tasks), confirmation, then the new payload versions.

use anyhow::{bail, Context};
use clap::Args;

use super::act::BulkArgs;
use super::operator::confirm;
use super::selection::SelectionArgs;
use crate::operations::{Actor, Operations, TransformAnswer, TransformRequest};
use crate::output::{errln, outln};

/// Options of `tasks transform`.
#[derive(Debug, Args)]
pub struct TransformArgs {
    /// Which tasks (failed, permanent_failure or discarded ones are transformed).
    #[command(flatten)]
    pub selection: SelectionArgs,
    /// The transform, a JSON list of operations on JSON Pointers:
    /// `[{"op":"rename","from":"/amount","path":"/amount_cents"}]` (ops: set, remove,
    /// rename, map; see docs/paced-redrive.md).
    #[arg(
        long,
        conflicts_with = "spec_file",
        required_unless_present = "spec_file"
    )]
    pub spec: Option<String>,
    /// Read the transform from this file (`-`: standard input).
    #[arg(long)]
    pub spec_file: Option<String>,
    /// Why (written to the audit log; required unless --dry-run).
    #[arg(long)]
    pub reason: Option<String>,
    /// Confirmation and output.
    #[command(flatten)]
    pub bulk: BulkArgs,
}

/// Runs `tasks transform`.
pub async fn run(operations: &Operations, args: TransformArgs) -> anyhow::Result<()> {
    let text = match (&args.spec, &args.spec_file) {
        (Some(spec), _) => spec.clone(),
        (None, Some(path)) if path == "-" => std::io::read_to_string(std::io::stdin())
            .context("reading the transform from standard input")?,
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the transform from {path}"))?,
        (None, None) => bail!("give the transform with --spec or --spec-file"),
    };
    let transform = serde_json::value::RawValue::from_string(text.trim().to_owned())
        .map_err(|e| anyhow::anyhow!("the transform is not JSON: {e}"))?;
    let actor = Actor::shell();
    let request = TransformRequest {
        ids: args.selection.ids.clone(),
        filter: args.selection.filter.given(),
        all: args.selection.all,
        transform: Some(transform),
        reason: args.reason.clone(),
        dry_run: true,
    };
    let preview = operations.transform(&actor, &request).await?;
    if args.bulk.dry_run {
        return print(&preview, args.bulk.json);
    }
    if preview.changed == 0 {
        print(&preview, args.bulk.json)?;
        errln!("no payload would change; nothing changed");
        return Ok(());
    }
    if !args.bulk.json {
        print(&preview, false)?;
    }
    let question = format!("write a new version of {} payload(s)?", preview.changed);
    if !confirm(&question, args.bulk.yes)? {
        bail!("not confirmed; nothing changed");
    }
    let done = TransformRequest {
        dry_run: false,
        ..request
    };
    let answer = operations.transform(&actor, &done).await?;
    if args.bulk.json {
        outln!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        outln!(
            "transform: {} payload(s) changed, {} left alone, {} failed{} (audit entry {})",
            answer.changed,
            answer.unchanged,
            answer.failed,
            match answer.raced {
                0 => String::new(),
                n => format!(", {n} changed meanwhile by someone else (left untouched)"),
            },
            answer.audit_id.unwrap_or_default()
        );
    }
    Ok(())
}

fn print(answer: &TransformAnswer, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(answer)?);
        return Ok(());
    }
    let done = match answer.dry_run {
        true => "would change",
        false => "changed",
    };
    outln!("transform:");
    for line in answer.transform.lines() {
        outln!("  {}", crate::readable::visible(line));
    }
    outln!(
        "{done} {} of {} task(s); {} left alone (nothing to change), {} fail (left untouched)",
        answer.changed,
        answer.matched,
        answer.unchanged,
        answer.failed
    );
    for sample in &answer.sample {
        outln!("  task {}:", sample.task);
        for change in &sample.changes {
            outln!("    {}", crate::readable::visible(&change.to_string()));
        }
    }
    for failure in &answer.failures {
        outln!(
            "  task {} fails: {}",
            failure.task,
            crate::readable::visible(&failure.reason)
        );
    }
    Ok(())
}

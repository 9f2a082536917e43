//! The `redrive` binary: the CLI with the built-in handlers.

/// mimalloc instead of the system allocator: a member allocates per task and per call on
/// many threads, where glibc's malloc spent about a tenth of the process's time
/// (`perf` of `redrive bench webhook`; figures in docs/scale.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    redrive::cli::main_with(|fleet| fleet.with_builtin_handlers()).await
}

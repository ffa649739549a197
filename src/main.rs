use clap::Parser;

fn main() {
    ember::cli::default_sigpipe();
    ember::run::mark_process_start();
    ember::memory::keep_freed_memory();
    let cli = ember::cli::Cli::parse();
    if let Err(err) = ember::cli::run(cli) {
        eprintln!("Error: {err:#}");
        // 128 + SIGINT, as a shell reports a process stopped by Ctrl-C.
        let interrupted = matches!(err.downcast_ref(), Some(ember::run::RunError::Interrupted { .. }));
        std::process::exit(if interrupted { 130 } else { 1 });
    }
}

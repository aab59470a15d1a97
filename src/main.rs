use clap::Parser;

fn main() {
    tdmpc2::trainer::stop::end_at_once_on_signals();
    envs::renderer::forget_an_empty_choice();
    // Limits on waits for other processes (workers, ranks, nodes) count from a continue after
    // Ctrl-Z or a scheduler's suspension, not across it.
    if let Err(error) = envs::deadline::counts_continues() {
        tdmpc2::errln!("warning: cannot count continues after a stop ({error})");
    }
    tdmpc2::memory::report_exhaustion_panics();
    let cli = tdmpc2::cli::Cli::parse_from(tdmpc2::cli::hydra_short_flags(std::env::args_os()));
    match std::panic::catch_unwind(|| tdmpc2::cli::run(cli)) {
        Ok(Ok(())) => {}
        // A stop that was asked for is no error; its exit code says it stopped.
        Ok(Err(error @ tdmpc2::Error::Stopped(_))) => {
            tdmpc2::errln!("{error}");
            std::process::exit(error.exit_code());
        }
        Ok(Err(error)) => {
            tdmpc2::errln!("error: {error}");
            std::process::exit(error.exit_code());
        }
        // Reported by the panic hook, and unwound: what ends trackers' runs and releases
        // locks has run.
        Err(panic) if tdmpc2::memory::is_exhaustion(panic.as_ref()) => {
            std::process::exit(tdmpc2::memory::EXHAUSTED_EXIT)
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

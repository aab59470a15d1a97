use clap::Parser;

fn main() {
    // Limits on waits for other processes (workers, ranks, nodes) count from a continue after
    // Ctrl-Z or a scheduler's suspension, not across it.
    if let Err(error) = envs::deadline::counts_continues() {
        tdmpc2::errln!("warning: cannot count continues after a stop ({error})");
    }
    tdmpc2::memory::report_exhaustion_panics();
    let cli = tdmpc2::cli::Cli::parse_from(tdmpc2::cli::hydra_short_flags(std::env::args_os()));
    if let Err(error) = tdmpc2::cli::run(cli) {
        tdmpc2::errln!("error: {error}");
        std::process::exit(error.exit_code());
    }
}

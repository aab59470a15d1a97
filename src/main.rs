use clap::Parser;

fn main() {
    let cli = tdmpc2::cli::Cli::parse_from(tdmpc2::cli::hydra_short_flags(std::env::args_os()));
    if let Err(error) = tdmpc2::cli::run(cli) {
        tdmpc2::errln!("error: {error}");
        std::process::exit(error.exit_code());
    }
}

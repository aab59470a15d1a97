use clap::Parser;

fn main() {
    let cli = tdmpc2::cli::Cli::parse();
    if let Err(error) = tdmpc2::cli::run(cli) {
        eprintln!("error: {error}");
        std::process::exit(error.exit_code());
    }
}

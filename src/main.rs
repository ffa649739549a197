use clap::Parser;

fn main() {
    let cli = ember::cli::Cli::parse();
    if let Err(err) = ember::cli::run(cli) {
        eprintln!("Error: {err:#}");
        std::process::exit(1);
    }
}

fn main() {
    std::process::exit(trainer::cli::main(std::env::args_os()));
}

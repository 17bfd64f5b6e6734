fn main() {
    std::process::exit(ps_server::cli::main(std::env::args_os()));
}

fn main() {
    ember::cli::main_with(ember::registry::Registry::builtin())
}

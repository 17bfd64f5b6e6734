fn main() -> anyhow::Result<()> {
    serving::run::main()
}

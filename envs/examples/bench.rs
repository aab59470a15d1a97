//! Agent steps per second of a task: `cargo run -p envs --release --example bench -- TASK [STEPS]`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let task = args.next().unwrap_or_else(|| "Pendulum-v1".into());
    let steps = match args.next() {
        Some(n) => n.parse()?,
        None => 10_000,
    };
    let mut env = envs::make(&task, 0)?;
    let rate = envs::bench::steps_per_second(env.as_mut(), steps, 0)?;
    println!("{task}: {rate:.0} agent steps/s over {steps} steps");
    Ok(())
}

//! A vector env worker process (`envs::vector::serve_worker`), for this crate's tests.
fn main() {
    if let Err(e) = envs::vector::serve_worker() {
        eprintln!("envs-worker: {e}");
        std::process::exit(1);
    }
}

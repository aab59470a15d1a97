//! Our SeedSequence / PCG64 / Generator against numpy itself.
mod common;

use envs::np_random::{NpRandom, SeedSequence};
use pyo3::prelude::*;

const NUMPY: &str = r#"
import numpy as np

def draws(seed):
    words = [int(w) for w in np.random.SeedSequence(seed).generate_state(4, np.uint64)]
    raw = [int(x) for x in np.random.PCG64(np.random.SeedSequence(seed)).random_raw(5)]
    g = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    doubles = [float(g.random()) for _ in range(5)]
    pair = [float(x) for x in g.uniform(low=np.array([-np.pi, -1.0]), high=np.array([np.pi, 1.0]))]
    scalar = float(g.uniform(low=-0.6, high=-0.4))
    return words, raw, doubles + pair + [scalar]
"#;

#[test]
fn seed_sequence_pcg64_and_uniform_match_numpy() {
    let seeds = [
        0u64,
        1,
        42,
        123_456_789,
        u32::MAX as u64,
        1 << 32,
        (1 << 63) + 5,
        u64::MAX,
    ];
    for seed in seeds {
        let (words, raw, doubles): (Vec<u64>, Vec<u64>, Vec<f64>) =
            common::with_module(NUMPY, "np_random_reference", |numpy| {
                numpy.getattr("draws")?.call1((seed,))?.extract()
            });
        {
            assert_eq!(
                SeedSequence::new(seed).generate_state_u64(4),
                words,
                "seed {seed}"
            );

            let mut rng = NpRandom::new(seed);
            let ours: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
            assert_eq!(ours, raw, "seed {seed}");

            let mut rng = NpRandom::new(seed);
            let mut ours: Vec<f64> = (0..5).map(|_| rng.random()).collect();
            ours.push(rng.uniform(-std::f64::consts::PI, std::f64::consts::PI));
            ours.push(rng.uniform(-1.0, 1.0));
            ours.push(rng.uniform(-0.6, -0.4));
            assert_eq!(ours, doubles, "seed {seed}");
        }
    }
}

//! numpy's default random stream, bit for bit: `np.random.Generator(np.random.PCG64(
//! np.random.SeedSequence(seed)))`, which is what gymnasium's `np_random(seed)` builds.

const POOL_SIZE: usize = 4;
const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;

/// numpy's `SeedSequence` for an integer entropy and no spawn key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedSequence {
    pool: [u32; POOL_SIZE],
}

fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut value = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    value = value.wrapping_mul(*hash_const);
    value ^ (value >> XSHIFT)
}

fn mix(x: u32, y: u32) -> u32 {
    let result = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    result ^ (result >> XSHIFT)
}

impl SeedSequence {
    pub fn new(entropy: u64) -> Self {
        // numpy splits a Python int into little-endian 32-bit words; 0 is one zero word.
        let entropy: Vec<u32> = if entropy >> 32 == 0 {
            vec![entropy as u32]
        } else {
            vec![entropy as u32, (entropy >> 32) as u32]
        };
        let mut hash_const = INIT_A;
        let mut pool = [0u32; POOL_SIZE];
        for (i, slot) in pool.iter_mut().enumerate() {
            *slot = hashmix(entropy.get(i).copied().unwrap_or(0), &mut hash_const);
        }
        for src in 0..POOL_SIZE {
            for dst in 0..POOL_SIZE {
                if src != dst {
                    pool[dst] = mix(pool[dst], hashmix(pool[src], &mut hash_const));
                }
            }
        }
        for &word in entropy.iter().skip(POOL_SIZE) {
            for slot in pool.iter_mut() {
                *slot = mix(*slot, hashmix(word, &mut hash_const));
            }
        }
        Self { pool }
    }

    pub fn generate_state_u32(&self, n_words: usize) -> Vec<u32> {
        let mut hash_const = INIT_B;
        self.pool
            .iter()
            .cycle()
            .take(n_words)
            .map(|&word| {
                let mut value = word ^ hash_const;
                hash_const = hash_const.wrapping_mul(MULT_B);
                value = value.wrapping_mul(hash_const);
                value ^ (value >> XSHIFT)
            })
            .collect()
    }

    /// 64-bit words are pairs of 32-bit words, low word first.
    pub fn generate_state_u64(&self, n_words: usize) -> Vec<u64> {
        self.generate_state_u32(2 * n_words)
            .chunks_exact(2)
            .map(|pair| u64::from(pair[0]) | (u64::from(pair[1]) << 32))
            .collect()
    }
}

const PCG_MULTIPLIER: u128 = 0x2360_ed05_1fc6_5da4_4385_df64_9fcc_f645;

/// numpy's `PCG64` bit generator (128-bit LCG with the XSL-RR output function).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pcg64 {
    state: u128,
    inc: u128,
}

impl Pcg64 {
    pub fn new(initstate: u128, initseq: u128) -> Self {
        let mut rng = Self {
            state: 0,
            inc: (initseq << 1) | 1,
        };
        rng.advance();
        rng.state = rng.state.wrapping_add(initstate);
        rng.advance();
        rng
    }

    pub fn from_seed_sequence(seq: &SeedSequence) -> Self {
        let w = seq.generate_state_u64(4);
        let join = |hi: u64, lo: u64| (u128::from(hi) << 64) | u128::from(lo);
        Self::new(join(w[0], w[1]), join(w[2], w[3]))
    }

    fn advance(&mut self) {
        self.state = self
            .state
            .wrapping_mul(PCG_MULTIPLIER)
            .wrapping_add(self.inc);
    }

    pub fn next_u64(&mut self) -> u64 {
        self.advance();
        let folded = ((self.state >> 64) as u64) ^ (self.state as u64);
        folded.rotate_right((self.state >> 122) as u32)
    }

    /// A double in [0, 1) from the top 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }
}

/// The subset of `np.random.Generator` the native environments use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpRandom {
    bits: Pcg64,
}

impl NpRandom {
    /// Same stream as `gymnasium.utils.seeding.np_random(seed)`.
    pub fn new(seed: u64) -> Self {
        Self {
            bits: Pcg64::from_seed_sequence(&SeedSequence::new(seed)),
        }
    }

    /// `Generator.random()`.
    pub fn random(&mut self) -> f64 {
        self.bits.next_f64()
    }

    /// `Generator.uniform(low, high)` for one scalar draw.
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        let range = high - low;
        low + range * self.random()
    }

    /// The raw 64-bit output (`bit_generator.random_raw()`).
    pub fn next_u64(&mut self) -> u64 {
        self.bits.next_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Printed by numpy 2.5 (SeedSequence(0).generate_state(4, np.uint64), PCG64(seed).random_raw,
    // default_rng(12345)); the integration tests compare many more seeds against numpy itself.
    #[test]
    fn matches_numpy_constants() {
        let words = SeedSequence::new(0).generate_state_u64(4);
        assert_eq!(
            words,
            [
                0xdb2c_d7e7_b0f4_78be,
                0xabf4_641a_2c71_ba49,
                0x20c6_ed6d_9d7b_8d41,
                0x2c40_99de_223c_39d4
            ]
        );
        let mut rng = NpRandom::new(0);
        let raw: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        assert_eq!(
            raw,
            [
                0xa30f_ebcf_d9c2_825f,
                0x4510_bdf8_82d9_d721,
                0x0a7d_3da9_4ecd_e8b8
            ]
        );
        let mut rng = NpRandom::new((1 << 40) + 7);
        assert_eq!(
            [rng.next_u64(), rng.next_u64()],
            [0xd46e_9e20_34de_21aa, 0x415b_adc9_9c08_7675]
        );
        let mut rng = NpRandom::new(12345);
        assert_eq!(rng.random(), 0.22733602246716966);
        assert_eq!(rng.uniform(-0.6, -0.4), -0.5366483320580494);
    }
}

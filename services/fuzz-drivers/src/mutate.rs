//! The smoke's input generator: a seeded pseudo-random number generator and a handful of
//! classic mutations (bit flips, byte changes, inserts, deletes, splices of two seeds,
//! dictionary tokens, boundary integers). It is deliberately small: it gives every target
//! a few thousand varied inputs on each test run; coverage-guided search is libFuzzer's job.

/// SplitMix64: tiny, fast, and the same sequence on every platform for a given seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// Values that sit on the boundaries parsers check (zero, one, sign bits, all ones).
const INTERESTING: [u64; 8] = [0, 1, 0x7f, 0x80, 0xff, 0x7fff_ffff, 0x8000_0000, u64::MAX];

/// Makes inputs for one target from its seeds and dictionary.
#[derive(Debug)]
pub struct Mutator<'a> {
    seeds: &'a [Vec<u8>],
    dict: &'a [Vec<u8>],
    max_len: usize,
}

impl<'a> Mutator<'a> {
    /// Inputs are cut to `max_len` bytes; with no seeds, they grow from the empty input.
    pub fn new(seeds: &'a [Vec<u8>], dict: &'a [Vec<u8>], max_len: usize) -> Self {
        Self {
            seeds,
            dict,
            max_len,
        }
    }

    /// One input: a random seed with one to eight mutations stacked on it.
    pub fn input(&self, rng: &mut Rng) -> Vec<u8> {
        let mut data = self.pick_seed(rng).to_vec();
        for _ in 0..=rng.below(8) {
            self.mutate(&mut data, rng);
        }
        data.truncate(self.max_len);
        data
    }

    fn pick_seed(&self, rng: &mut Rng) -> &'a [u8] {
        let seed = self.seeds.get(rng.below(self.seeds.len()));
        seed.map_or(&[], Vec::as_slice)
    }

    fn mutate(&self, data: &mut Vec<u8>, rng: &mut Rng) {
        let at = rng.below(data.len() + 1);
        match rng.below(7) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = rng.next_u64() as u8;
            }
            2 => {
                let bytes: Vec<u8> = (0..=rng.below(8)).map(|_| rng.next_u64() as u8).collect();
                data.splice(at..at, bytes);
            }
            3 => {
                let end = (at + 1 + rng.below(16)).min(data.len());
                data.drain(at.min(end)..end);
            }
            4 => {
                // Splice: our head, another seed's tail.
                let other = self.pick_seed(rng);
                let from = rng.below(other.len() + 1);
                data.truncate(at);
                data.extend_from_slice(&other[from..]);
            }
            5 if !self.dict.is_empty() => {
                let token = &self.dict[rng.below(self.dict.len())];
                if rng.below(2) == 0 {
                    data.splice(at..at, token.iter().copied());
                } else {
                    let end = (at + token.len()).min(data.len());
                    data.splice(at..end, token.iter().copied());
                }
            }
            _ => {
                // A boundary value as a big-endian integer of 1, 2, 4 or 8 bytes, overwriting.
                let width = 1 << rng.below(4);
                let value = INTERESTING[rng.below(INTERESTING.len())].to_be_bytes();
                let end = (at + width).min(data.len());
                data.splice(at..end, value[8 - width..].iter().copied());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(seed: u64, count: usize) -> Vec<Vec<u8>> {
        let seeds = [b"hello world".to_vec(), vec![0u8; 40]];
        let dict = [b"TOKEN".to_vec()];
        let mutator = Mutator::new(&seeds, &dict, 32);
        let mut rng = Rng::new(seed);
        (0..count).map(|_| mutator.input(&mut rng)).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_inputs() {
        assert_eq!(inputs(7, 500), inputs(7, 500));
        assert_ne!(inputs(7, 500), inputs(8, 500));
    }

    #[test]
    fn inputs_vary_respect_the_length_limit_and_use_the_dictionary() {
        let all = inputs(1, 2000);
        assert!(all.iter().all(|i| i.len() <= 32));
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert!(distinct.len() > 1500, "{} distinct inputs", distinct.len());
        assert!(all.iter().any(|i| i.windows(5).any(|w| w == b"TOKEN")));
        assert!(all
            .iter()
            .any(|i| i.starts_with(b"hello") && i.contains(&0)));
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = Rng::new(3);
        assert_eq!(rng.below(0), 0);
        assert!((0..1000).all(|_| rng.below(10) < 10));
    }
}

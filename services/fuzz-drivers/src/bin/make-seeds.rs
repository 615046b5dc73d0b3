//! Writes every fuzz target's seeds as libFuzzer seed corpora: `make-seeds [DIR]` (default
//! `corpus`) creates `DIR/TARGET/seed-NAME` for each target in `ferry_fuzz_drivers::DRIVERS`.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let root = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("corpus"), PathBuf::from);
    for driver in ferry_fuzz_drivers::DRIVERS {
        let dir = root.join(driver.name);
        std::fs::create_dir_all(&dir)?;
        let seeds = (driver.seeds)();
        for seed in &seeds {
            std::fs::write(dir.join(format!("seed-{}", seed.name)), &seed.bytes)?;
        }
        println!("{}: {} seeds", dir.display(), seeds.len());
    }
    Ok(())
}

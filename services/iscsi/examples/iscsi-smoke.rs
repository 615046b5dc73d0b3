//! Manual check against a running target: `iscsi-smoke HOST:PORT IQN LUN [USER SECRET]`.
//! Discovers, writes and reads back 4 MiB with many commands in flight, and prints what
//! the LUN reports.

use ferry_iscsi::{Chap, Config, Device};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: iscsi-smoke HOST:PORT IQN LUN [USER SECRET] [digest]".into());
    }
    let mut config = Config::default();
    if args.len() >= 6 {
        config.chap = Some(Chap {
            user: args[4].clone(),
            secret: args[5].clone(),
        });
    }
    if args.len() >= 7 {
        config.header_digest = true;
        config.data_digest = true;
    }
    let targets = ferry_iscsi::discover(&args[1], &config).await?;
    println!("discovered {targets:?}");
    let dev = Device::open(&args[1], &args[2], args[3].parse()?, &config).await?;
    println!("{:?}\nparams {:?}", dev.capacity(), dev.session().params());
    println!("{:?}\n{:?}", dev.limits(), dev.provisioning());
    dev.session().ping().await?;
    let bs = u64::from(dev.block_size());
    let data: Vec<u8> = (0..4 << 20)
        .map(|i: usize| (i as u8).wrapping_mul(7) | 1)
        .collect();
    let chunk = 512 * 1024;
    let w = data.chunks(chunk).enumerate().map(|(i, c)| {
        let dev = &dev;
        async move { dev.write((i * chunk) as u64 / bs, c).await }
    });
    for r in futures_join(w).await {
        r?;
    }
    dev.sync().await?;
    let back = dev.read(0, vec![0u8; data.len()]).await?;
    println!("read back equal: {}", back == data);
    if dev.thin() {
        let mib = (1 << 20) / bs;
        dev.write_same_zero(mib, mib as u32, true).await?;
        dev.unmap(&[(2 * mib, mib as u32)]).await?;
        println!("lba status 0: {:?}", dev.lba_status(0).await?);
        println!("lba status 1MiB: {:?}", dev.lba_status(mib).await?);
    }
    match dev
        .read(dev.capacity().blocks, vec![0u8; bs as usize])
        .await
    {
        Ok(_) => println!("read past end succeeded?!"),
        Err(e) => println!("past end: {e}"),
    }
    let r = dev
        .session()
        .execute(
            1,
            &ferry_iscsi::scsi::read16(dev.capacity().blocks, 1),
            ferry_iscsi::Transfer::Read(Box::new(vec![0u8; bs as usize])),
        )
        .await;
    println!("raw past end: {:?}", r.err().map(|e| e.to_string()));
    dev.close().await?;
    println!("ok");
    Ok(())
}

async fn futures_join<F: std::future::Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut out = Vec::new();
    let handles: Vec<_> = fs.collect();
    for f in handles {
        out.push(f.await);
    }
    out
}

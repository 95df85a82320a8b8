//! The flash model is a block device like the others: `nearrec-io`'s suite over it, for every
//! parameter set, with its bytes from memory and from the real files.

#[path = "../../nearrec-io/tests/suite/mod.rs"]
#[macro_use]
mod suite;

use nearrec_device::{DeviceConfig, FlashDevice};
use nearrec_io::{BlockDevice, DeviceKind, IoConfig, MemDevice, open_device};
use suite::Fixture;

fn devices(fx: &Fixture) -> Vec<(String, Box<dyn BlockDevice>)> {
    let mut out: Vec<(String, Box<dyn BlockDevice>)> = Vec::new();
    for name in DeviceConfig::PRESETS {
        let cfg = DeviceConfig::preset(name).unwrap();
        let mem = MemDevice::new(fx.contents.clone(), 512);
        out.push((
            format!("{name} over memory"),
            Box::new(FlashDevice::new(mem, cfg.clone())),
        ));
        let io = IoConfig::default()
            .with_kind(DeviceKind::Pread)
            .with_direct(true);
        let files = open_device(&fx.paths, &io).unwrap();
        out.push((
            format!("{name} over pread"),
            Box::new(FlashDevice::new(files, cfg)),
        ));
    }
    out
}

block_device_suite!(devices);

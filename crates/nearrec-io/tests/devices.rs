//! The block-device suite (`suite/mod.rs`) over io_uring, pread (direct and buffered) and memory.

#[macro_use]
mod suite;

use nearrec_io::{BlockDevice, DeviceKind, IoConfig, MemDevice, open_device};
use suite::Fixture;

/// Every device under test, named.
fn devices(fx: &Fixture) -> Vec<(String, Box<dyn BlockDevice>)> {
    let mut out: Vec<(String, Box<dyn BlockDevice>)> = vec![(
        "memory".into(),
        Box::new(MemDevice::new(fx.contents.clone(), 512)),
    )];
    for kind in [DeviceKind::Uring, DeviceKind::Pread] {
        for direct in [true, false] {
            let cfg = IoConfig::default()
                .with_kind(kind)
                .with_direct(direct)
                .with_queue_depth(16);
            let dev = open_device(&fx.paths, &cfg)
                .unwrap_or_else(|e| panic!("{kind:?} direct={direct}: {e}"));
            out.push((format!("{kind:?} direct={direct}"), dev));
        }
    }
    out
}

block_device_suite!(devices);

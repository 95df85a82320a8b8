//! The flash model is a block device like the others: `nearrec-io`'s suite over it, for every
//! parameter set, with its bytes from memory and from the real files.

#[path = "../../nearrec-io/tests/suite/mod.rs"]
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

#[test]
fn reads_return_the_file_bytes_once_each_in_any_order() {
    suite::reads_return_the_file_bytes_once_each_in_any_order(devices);
}

#[test]
fn malformed_batches_are_refused_before_any_read() {
    suite::malformed_batches_are_refused_before_any_read(devices);
}

#[test]
fn a_file_that_shrank_gives_a_short_read_naming_it() {
    suite::a_file_that_shrank_gives_a_short_read_naming_it(devices);
}

#[test]
fn devices_work_in_a_forked_child() {
    suite::devices_work_in_a_forked_child(devices);
}

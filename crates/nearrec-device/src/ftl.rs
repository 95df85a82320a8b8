//! The flash translation layer, read side: a file's bytes → logical block addresses (the extents
//! RM-SSD's EV translator keeps per table) → a page on a channel, die and plane. Pages are striped
//! linearly: consecutive logical pages go to consecutive channels, then dies, then planes, as
//! RM-SSD's linear mapping spreads a table over every channel.

use crate::config::FlashConfig;

/// A run of a file's bytes stored at consecutive logical bytes from `lba_byte`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub file: u32,
    pub file_offset: u64,
    pub lba_byte: u64,
    pub len: u64,
}

/// Where a logical page lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageAddr {
    /// Logical page number (also the page's identity for merging and caching).
    pub lpn: u64,
    pub channel: u32,
    /// Page register (die × plane), `0..units`.
    pub unit: u32,
}

/// Maps files to pages.
#[derive(Debug, Clone)]
pub struct Ftl {
    /// Per file, its extents in file order.
    extents: Vec<Vec<Extent>>,
    page: u64,
    channels: u64,
    dies: u64,
    planes: u64,
}

impl Ftl {
    /// Lays the files out back to back, each from a page boundary, as one extent each.
    pub fn contiguous(file_lens: &[u64], flash: &FlashConfig) -> Self {
        let page = u64::from(flash.page_bytes);
        let mut at = 0;
        let extents = file_lens
            .iter()
            .enumerate()
            .map(|(f, &len)| {
                let e = Extent {
                    file: f as u32,
                    file_offset: 0,
                    lba_byte: at,
                    len,
                };
                at += len.div_ceil(page) * page;
                vec![e]
            })
            .collect();
        Self::with_extents(extents, flash)
    }

    /// Uses the given extents (file `i`'s in `extents[i]`, in file order, covering it).
    pub fn with_extents(extents: Vec<Vec<Extent>>, flash: &FlashConfig) -> Self {
        Self {
            extents,
            page: u64::from(flash.page_bytes),
            channels: u64::from(flash.channels),
            dies: u64::from(flash.dies_per_channel),
            planes: u64::from(flash.planes_per_die),
        }
    }

    /// The logical byte of `offset` in `file` (the EV translator's steps 3–5).
    ///
    /// # Panics
    /// If no extent covers the byte (callers check offsets against the file's length first).
    pub fn lba_byte(&self, file: u32, offset: u64) -> u64 {
        let ext = &self.extents[file as usize];
        let i = ext.partition_point(|e| e.file_offset + e.len <= offset);
        let e = ext.get(i).expect("an extent covers every byte of the file");
        e.lba_byte + (offset - e.file_offset)
    }

    /// The page holding logical byte `lba_byte`.
    pub fn page_of(&self, lba_byte: u64) -> PageAddr {
        let lpn = lba_byte / self.page;
        let channel = lpn % self.channels;
        let die = (lpn / self.channels) % self.dies;
        let plane = (lpn / (self.channels * self.dies)) % self.planes;
        PageAddr {
            lpn,
            channel: channel as u32,
            unit: ((channel * self.dies + die) * self.planes + plane) as u32,
        }
    }

    /// The pages `len` bytes at `offset` of `file` touch, with the bytes wanted from each.
    pub fn pages(&self, file: u32, offset: u64, len: u64) -> Vec<(PageAddr, u64)> {
        let mut out = Vec::new();
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let lba = self.lba_byte(file, at);
            let in_page = self.page - lba % self.page;
            let take = in_page.min(end - at);
            out.push((self.page_of(lba), take));
            at += take;
        }
        out
    }

    pub fn page_bytes(&self) -> u64 {
        self.page
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DeviceConfig;

    #[test]
    fn pages_stripe_over_channels_then_dies() {
        let mut f = DeviceConfig::rm_ssd().flash;
        f.dies_per_channel = 2;
        let ftl = Ftl::contiguous(&[5 * 4096 + 10, 4096], &f);
        let chans: Vec<_> = (0..6).map(|p| ftl.page_of(p * 4096).channel).collect();
        assert_eq!(chans, [0, 1, 2, 3, 0, 1]);
        assert_eq!(
            ftl.page_of(4 * 4096).unit,
            1,
            "page 4 is on channel 0's second die"
        );
        // The second file starts at the page after the first one's six.
        assert_eq!(ftl.lba_byte(1, 100), 6 * 4096 + 100);
        let spans = ftl.pages(0, 4000, 200);
        assert_eq!(spans.len(), 2);
        assert_eq!((spans[0].1, spans[1].1), (96, 104));
        assert_eq!(spans[1].0.lpn, 1);
    }

    #[test]
    fn extents_translate_like_the_ev_translator() {
        let f = DeviceConfig::rm_ssd().flash;
        let ext = vec![vec![
            Extent {
                file: 0,
                file_offset: 0,
                lba_byte: 40960,
                len: 8192,
            },
            Extent {
                file: 0,
                file_offset: 8192,
                lba_byte: 4096,
                len: 8192,
            },
        ]];
        let ftl = Ftl::with_extents(ext, &f);
        assert_eq!(ftl.lba_byte(0, 100), 40960 + 100);
        assert_eq!(ftl.lba_byte(0, 8192 + 5), 4096 + 5);
    }
}

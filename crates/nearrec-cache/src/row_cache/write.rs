//! Writes into the cache: a miss offered, a compaction's replaced row, a warmed row filled; under
//! the write lock, or kept aside (deferred) while readers hold the cache.

use super::*;

impl RowCache {
    /// The write lock: every reader has left (a poisoned lock is taken as it is: a write never
    /// panics half-way, see [`Self::write`]).
    pub(super) fn write_lock(&self) -> RwLockWriteGuard<'_, u64> {
        self.gate.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes key `key` (0: empty), tag `tag` and `bytes` into slot `way` of `set`; the caller
    /// holds the write lock, so no reader is looking.
    pub(super) fn write(&self, set: Set, way: usize, key: u64, tag: u8, bytes: &[u8]) {
        let slot = set.number() * self.ways + way;
        let [stored, _] = self.head(slot);
        // SAFETY: the slot's bytes lie inside `data` (`write_shared` checks); the write lock
        // keeps every reader out, and every other writer waits for it
        unsafe {
            self.data
                .write_shared(slot * self.stride + 8 * HEAD_WORDS, bytes)
        };
        stored.store(key, Ordering::Relaxed);
        let tags = set.number() * self.tag_words + way / 8;
        // SAFETY: inside the set's tag words (way < ways)
        let word = unsafe { Self::word(&self.tags, tags) };
        let shift = way % 8 * 8;
        let old = word.load(Ordering::Relaxed) & !(0xff << shift);
        word.store(old | u64::from(tag) << shift, Ordering::Relaxed);
    }

    /// The tag of way `way` of set `order` (both in range).
    pub(super) fn tag_at(&self, order: usize, way: usize) -> u8 {
        assert!(order < self.sets && way < self.ways);
        // SAFETY: inside the set's tag words (checked above)
        let word = unsafe { Self::word(&self.tags, order * self.tag_words + way / 8) };
        (word.load(Ordering::Relaxed) >> (way % 8 * 8)) as u8
    }

    /// The way of `row` in `set`, if it holds it.
    pub(super) fn way_of(&self, set: Set, row: u64) -> Option<usize> {
        let base = set.number() * self.ways;
        (0..self.ways).find(|&w| self.key(base + w) == key_of(row))
    }

    /// The first free way of `set`.
    pub(super) fn free_way(&self, set: Set) -> Option<usize> {
        let base = set.number() * self.ways;
        (0..self.ways).find(|&w| self.key(base + w) == EMPTY)
    }

    /// Replaces `row`'s bytes if it is cached (a live store's compaction: the row changed
    /// below); returns whether it was. Waits for the readers in; rows kept aside are written
    /// first, so an older copy of the row never lands after it. Neither a hit nor an
    /// admission: no counter moves.
    pub fn replace(&self, row: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        assert!(row < u64::MAX - 1, "row {row} is no table's");
        let Some(set) = self.locate(row) else {
            return false;
        };
        let replaced = {
            let mut draws = self.write_lock();
            self.drain(&mut draws);
            let way = self.way_of(set, row);
            way.inspect(|&way| self.write(set, way, key_of(row), set.tag(), bytes))
                .is_some()
        };
        self.settle();
        replaced
    }

    /// Offers a row read from below after a miss (see the module docs). Never call it while
    /// holding a [`Reader`] of this cache: an offer that finds no room aside waits for every
    /// reader to leave.
    pub fn offer(&self, row: u64, bytes: &[u8]) -> Offer {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        assert!(row < u64::MAX - 1, "row {row} is no table's");
        let mut draws = match self.gate.try_write() {
            Ok(draws) => draws,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                if self.defer(row, bytes) {
                    return Offer::Deferred;
                }
                self.write_lock()
            }
        };
        self.drain(&mut draws);
        let offer = self.offer_now(&mut draws, row, bytes);
        drop(draws);
        self.settle();
        offer
    }

    /// [`Self::offer`] with the write lock held (`draws`: its admission draws).
    pub(super) fn offer_now(&self, draws: &mut u64, row: u64, bytes: &[u8]) -> Offer {
        let Some(set) = self.locate(row) else {
            CacheStats::add(&self.stats.rejections, 1);
            return Offer::Rejected;
        };
        if self.way_of(set, row).is_some() {
            return Offer::Present;
        }
        let base = set.number() * self.ways;
        let (way, evicted) = match self.free_way(set) {
            Some(way) => (way, None),
            None => {
                if self.config.policy.probabilistic() {
                    *draws += 1;
                    let draw = mix(self.config.seed ^ mix(set.number() as u64) ^ *draws);
                    if draw >= self.admit_below {
                        CacheStats::add(&self.stats.rejections, 1);
                        return Offer::Rejected;
                    }
                }
                let way = (0..self.ways)
                    .min_by_key(|&w| self.head(base + w)[1].load(Ordering::Relaxed))
                    .expect("a set has at least one way");
                (way, Some(row_of(self.key(base + way))))
            }
        };
        self.admit(set, way, row, bytes);
        if evicted.is_some() {
            CacheStats::add(&self.stats.evictions, 1);
        }
        Offer::Admitted { evicted }
    }

    /// Keeps an offered row aside while readers hold the cache; false when there is no room.
    pub(super) fn defer(&self, row: u64, bytes: &[u8]) -> bool {
        {
            let mut aside = self.deferred.lock().unwrap_or_else(PoisonError::into_inner);
            if aside.bytes.len() + bytes.len() > DEFERRED_BYTES.max(bytes.len()) {
                return false;
            }
            aside.rows.push(row);
            aside.bytes.extend_from_slice(bytes);
            self.any_deferred.store(true, Ordering::SeqCst);
        }
        // the readers may all have left since the lock was tried
        self.settle();
        true
    }

    /// Offers the rows kept aside; the caller holds the write lock (`draws`).
    pub(super) fn drain(&self, draws: &mut u64) {
        if !self.any_deferred.load(Ordering::Relaxed) {
            return;
        }
        let Deferred { rows, bytes } = {
            let mut aside = self.deferred.lock().unwrap_or_else(PoisonError::into_inner);
            self.any_deferred.store(false, Ordering::SeqCst);
            std::mem::take(&mut *aside)
        };
        for (&row, bytes) in rows.iter().zip(bytes.chunks_exact(self.row_bytes.max(1))) {
            self.offer_now(draws, row, bytes);
        }
    }

    /// After the lock is let go: writes the rows kept aside if no one holds it now (whoever
    /// does settles when they let go). The fence pairs with the one a deferring writer's store
    /// of `any_deferred` is followed by (in its own `settle`): either that writer finds the
    /// lock free, or this one finds its row.
    pub(super) fn settle(&self) {
        fence(Ordering::SeqCst);
        while self.any_deferred.load(Ordering::SeqCst) {
            let mut draws = match self.gate.try_write() {
                Ok(draws) => draws,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            self.drain(&mut draws);
        }
    }

    /// Puts a row into a free way of its set, evicting nothing: a warm-up's rows, offered most
    /// wanted first, so that a less wanted row never displaces a more wanted one. False when
    /// its set is full or the row is cached already. Waits for the readers in.
    pub fn fill(&self, row: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        assert!(row < u64::MAX - 1, "row {row} is no table's");
        let Some(set) = self.locate(row) else {
            return false;
        };
        let filled = {
            let mut draws = self.write_lock();
            self.drain(&mut draws);
            match self.free_way(set) {
                Some(way) if self.way_of(set, row).is_none() => {
                    self.admit(set, way, row, bytes);
                    true
                }
                _ => false,
            }
        };
        self.settle();
        filled
    }

    /// Writes `row` into way `way` of `set` (the caller holds the write lock), marked as just
    /// used.
    pub(super) fn admit(&self, set: Set, way: usize, row: u64, bytes: &[u8]) {
        let stamp = self.head(set.number() * self.ways + way)[1];
        if self.config.policy.frequency() {
            stamp.store(1, Ordering::Relaxed);
        } else {
            mark::<false>(stamp, self.clock(set.number()));
        }
        self.write(set, way, key_of(row), set.tag(), bytes);
        CacheStats::add(&self.stats.admissions, 1);
    }
}

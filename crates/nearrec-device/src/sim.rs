//! The discrete-event core: commands flow through host, link, controller and flash servers on a
//! simulated clock.
//!
//! Every resource is a FIFO server with a number of identical slots (host I/O threads, controller
//! cores, the PCIe link, each die's page register, each channel's bus). A command passes its `pre`
//! steps in order, then forks into flash pieces that run in parallel, then joins and passes its
//! `post` steps. A flash piece holds its die from the start of the array read (flush) until its
//! bytes have crossed the channel: the page register is busy until it is drained, so reads to one
//! die serialise and transfers on one channel contend. At most `queue_depth` commands are in
//! flight; the rest wait for a completion (a closed loop, as a host queue behaves).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// A resource a step occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// A host CPU thread doing I/O work (system call, driver, polling, pooling).
    Host,
    /// A controller core (FTL firmware, in-device pooling on an embedded CPU).
    Controller,
    /// The host link (PCIe), one transfer at a time.
    Link,
    /// No resource: a fixed latency (a doorbell, an interrupt).
    Delay,
}

/// `ns` of work on `resource`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub resource: Resource,
    pub ns: u64,
}

impl Step {
    pub fn new(resource: Resource, ns: u64) -> Self {
        Self { resource, ns }
    }
}

/// One flash read: an array read on a die (plane), then a transfer on its channel, then optional
/// work on the controller (extracting rows from the page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Index of the page register (die × plane) in `0..units`.
    pub unit: u32,
    pub channel: u32,
    pub flush_ns: u64,
    pub transfer_ns: u64,
    /// Bytes the transfer moves (for accounting).
    pub bytes: u64,
    pub after: Option<Step>,
}

/// One command: released at `release_ns`, then `pre` steps, flash pieces in parallel, `post` steps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Command {
    pub release_ns: u64,
    pub pre: Vec<Step>,
    pub pieces: Vec<Piece>,
    pub post: Vec<Step>,
}

/// Slots of each shared resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Servers {
    pub host: u32,
    pub controller: u32,
    pub units: u32,
    pub channels: u32,
}

/// When each command finished, and how busy the flash was.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Finish time of each command, in `commands` order.
    pub finish_ns: Vec<u64>,
    /// The last finish (0 for no commands).
    pub end_ns: u64,
    /// Nanoseconds each channel's bus was transferring.
    pub channel_busy_ns: Vec<u64>,
    /// Flash reads, and the bytes they moved over the channels.
    pub flash_reads: u64,
    pub channel_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Token {
    Release(u32),
    Pre(u32, u32),
    Flush(u32, u32),
    Transfer(u32, u32),
    After(u32, u32),
    Post(u32, u32),
}

#[derive(Debug)]
struct Server {
    free: u32,
    waiting: VecDeque<(Token, u64)>,
}

struct State<'a> {
    commands: &'a [Command],
    servers: Vec<Server>,
    events: BinaryHeap<Reverse<(u64, u64, Token)>>,
    seq: u64,
    host: usize,
    controller: usize,
    link: usize,
    units: usize,
    channels: usize,
    left: Vec<u32>,
    /// Commands in release order, and the next to enter the queue.
    order: Vec<u32>,
    next: usize,
    out: Outcome,
}

impl State<'_> {
    fn at(&mut self, t: u64, token: Token) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, token)));
    }

    fn server_of(&self, r: Resource) -> Option<usize> {
        match r {
            Resource::Host => Some(self.host),
            Resource::Controller => Some(self.controller),
            Resource::Link => Some(self.link),
            Resource::Delay => None,
        }
    }

    /// Takes a slot of `server` (or queues) for `ns`; `token` fires when the work ends.
    fn acquire(&mut self, t: u64, server: Option<usize>, token: Token, ns: u64) {
        match server {
            None => self.at(t + ns, token),
            Some(s) if self.servers[s].free > 0 => {
                self.servers[s].free -= 1;
                self.at(t + ns, token);
            }
            Some(s) => self.servers[s].waiting.push_back((token, ns)),
        }
    }

    /// Frees a slot of `server`, handing it straight to the next waiter.
    fn release(&mut self, t: u64, server: Option<usize>) {
        let Some(s) = server else { return };
        match self.servers[s].waiting.pop_front() {
            Some((token, ns)) => self.at(t + ns, token),
            None => self.servers[s].free += 1,
        }
    }

    fn step(&mut self, t: u64, c: u32, phase_pre: bool, i: u32) {
        let cmd = &self.commands[c as usize];
        let steps = if phase_pre { &cmd.pre } else { &cmd.post };
        if let Some(&s) = steps.get(i as usize) {
            let token = if phase_pre {
                Token::Pre(c, i)
            } else {
                Token::Post(c, i)
            };
            let server = self.server_of(s.resource);
            self.acquire(t, server, token, s.ns);
        } else if phase_pre {
            self.fork(t, c);
        } else {
            self.out.finish_ns[c as usize] = t;
            self.out.end_ns = self.out.end_ns.max(t);
            // A slot of the queue opened: the next command enters (not before its release).
            if let Some(&c2) = self.order.get(self.next) {
                self.next += 1;
                let r = self.commands[c2 as usize].release_ns.max(t);
                self.at(r, Token::Release(c2));
            }
        }
    }

    fn fork(&mut self, t: u64, c: u32) {
        let n = self.commands[c as usize].pieces.len();
        if n == 0 {
            self.step(t, c, false, 0);
            return;
        }
        self.left[c as usize] = n as u32;
        for p in 0..n {
            let piece = self.commands[c as usize].pieces[p];
            let unit = self.units + piece.unit as usize;
            self.acquire(t, Some(unit), Token::Flush(c, p as u32), piece.flush_ns);
        }
    }

    fn piece_done(&mut self, t: u64, c: u32) {
        self.left[c as usize] -= 1;
        if self.left[c as usize] == 0 {
            self.step(t, c, false, 0);
        }
    }
}

/// Runs `commands` (sorted or not by release time) on `servers`, at most `queue_depth` in flight.
///
/// # Panics
/// If a piece names a unit or channel outside `servers`, or there are more than `u32::MAX`
/// commands (both caller bugs).
pub fn run(commands: &[Command], servers: Servers, queue_depth: u32) -> Outcome {
    let slot = |free| Server {
        free,
        waiting: VecDeque::new(),
    };
    let mut list = vec![
        slot(servers.host.max(1)),
        slot(servers.controller.max(1)),
        slot(1),
    ];
    list.extend((0..servers.units).map(|_| slot(1)));
    list.extend((0..servers.channels).map(|_| slot(1)));
    let n = u32::try_from(commands.len()).expect("fewer than 2^32 commands");
    let mut st = State {
        commands,
        servers: list,
        events: BinaryHeap::new(),
        seq: 0,
        host: 0,
        controller: 1,
        link: 2,
        units: 3,
        channels: 3 + servers.units as usize,
        left: vec![0; commands.len()],
        order: Vec::new(),
        next: 0,
        out: Outcome {
            finish_ns: vec![0; commands.len()],
            end_ns: 0,
            channel_busy_ns: vec![0; servers.channels as usize],
            flash_reads: 0,
            channel_bytes: 0,
        },
    };
    for p in commands.iter().flat_map(|c| &c.pieces) {
        assert!(
            p.unit < servers.units && p.channel < servers.channels,
            "piece outside the device"
        );
    }
    // Commands enter in release order; at most `queue_depth` are in flight.
    st.order = (0..n).collect();
    st.order
        .sort_by_key(|&c| (commands[c as usize].release_ns, c));
    st.next = st.order.len().min(queue_depth.max(1) as usize);
    for i in 0..st.next {
        let c = st.order[i];
        st.at(commands[c as usize].release_ns, Token::Release(c));
    }
    while let Some(Reverse((t, _, token))) = st.events.pop() {
        match token {
            Token::Release(c) => st.step(t, c, true, 0),
            Token::Pre(c, i) => {
                let s = st.commands[c as usize].pre[i as usize];
                let server = st.server_of(s.resource);
                st.release(t, server);
                st.step(t, c, true, i + 1);
            }
            Token::Flush(c, p) => {
                // The die keeps its page register until the transfer drains it.
                let piece = st.commands[c as usize].pieces[p as usize];
                let ch = st.channels + piece.channel as usize;
                st.acquire(t, Some(ch), Token::Transfer(c, p), piece.transfer_ns);
            }
            Token::Transfer(c, p) => {
                let piece = st.commands[c as usize].pieces[p as usize];
                st.out.channel_busy_ns[piece.channel as usize] += piece.transfer_ns;
                st.out.flash_reads += 1;
                st.out.channel_bytes += piece.bytes;
                st.release(t, Some(st.channels + piece.channel as usize));
                st.release(t, Some(st.units + piece.unit as usize));
                match piece.after {
                    Some(s) => {
                        let server = st.server_of(s.resource);
                        st.acquire(t, server, Token::After(c, p), s.ns);
                    }
                    None => st.piece_done(t, c),
                }
            }
            Token::After(c, p) => {
                let s = st.commands[c as usize].pieces[p as usize]
                    .after
                    .expect("after step");
                let server = st.server_of(s.resource);
                st.release(t, server);
                st.piece_done(t, c);
            }
            Token::Post(c, i) => {
                let s = st.commands[c as usize].post[i as usize];
                let server = st.server_of(s.resource);
                st.release(t, server);
                st.step(t, c, false, i + 1);
            }
        }
    }
    st.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(units: u32, channels: u32) -> Servers {
        Servers {
            host: 1,
            controller: 1,
            units,
            channels,
        }
    }

    fn read(unit: u32, channel: u32) -> Command {
        Command {
            release_ns: 0,
            pre: vec![Step::new(Resource::Delay, 1)],
            pieces: vec![Piece {
                unit,
                channel,
                flush_ns: 70,
                transfer_ns: 30,
                bytes: 3,
                after: None,
            }],
            post: vec![Step::new(Resource::Delay, 0)],
        }
    }

    #[test]
    fn one_read_takes_flush_plus_transfer() {
        let out = run(&[read(0, 0)], servers(1, 1), 1);
        assert_eq!(out.finish_ns, vec![101]);
        assert_eq!(out.channel_busy_ns, vec![30]);
    }

    #[test]
    fn reads_to_one_die_serialise_and_dies_on_one_channel_share_its_bus() {
        let out = run(&[read(0, 0), read(0, 0)], servers(2, 1), 8);
        assert_eq!(out.end_ns, 201);
        // Two dies, one channel: flushes overlap, transfers queue.
        let out = run(&[read(0, 0), read(1, 0)], servers(2, 1), 8);
        assert_eq!(out.finish_ns.iter().max(), Some(&131));
        // Two channels: fully parallel.
        let out = run(&[read(0, 0), read(1, 1)], servers(2, 2), 8);
        assert_eq!(out.end_ns, 101);
    }

    #[test]
    fn queue_depth_one_runs_commands_back_to_back() {
        let cmds: Vec<_> = (0..4).map(|i| read(i, i)).collect();
        assert_eq!(run(&cmds, servers(4, 4), 1).end_ns, 404);
        assert_eq!(run(&cmds, servers(4, 4), 4).end_ns, 101);
    }

    #[test]
    fn a_command_joins_all_its_pieces_and_waits_for_a_busy_controller() {
        let mut c = read(0, 0);
        c.pieces.push(Piece {
            unit: 1,
            channel: 1,
            flush_ns: 10,
            transfer_ns: 5,
            bytes: 1,
            after: Some(Step::new(Resource::Controller, 200)),
        });
        let out = run(&[c.clone(), c], servers(2, 2), 8);
        // Pieces on unit 1 end at 16 and 31; their controller work runs 16..216, 216..416.
        assert_eq!(out.finish_ns, vec![216, 416]);
    }
}

//! The links R->P (R's replicas to P's etcd), each through its own delay
//! proxy when `up` had --link-delay or --link-jitter; `cut` and `heal`; and
//! the proxy itself (`aether-e2e link-proxy`, run detached by `up`).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::thread::{sleep, spawn};
use std::time::{Duration, Instant};

use crate::procs::{alive, free_port, listens, ours, spawn_detached, stop_pids};
use crate::state::{Mesh, PortPid};

impl Mesh {
    /// Where R's replicas reach P's etcd: the link's proxy if there is one.
    pub(crate) fn peer_url(&self, r: &str, p: &str) -> String {
        match self.link(r, p) {
            Some(l) => format!("http://127.0.0.1:{}", l.port),
            None => self.etcd_url(p),
        }
    }

    /// This harness's own binary, copied into the state dir by `up`.
    pub(crate) fn e2e_bin(&self) -> PathBuf {
        self.path("bin/aether-e2e")
    }

    fn link_start(&mut self, r: &str, p: &str) -> Result<(), String> {
        let key = format!("{r}>{p}");
        let port = self.st.links.get(&key).map_or(0, |l| l.port);
        let up = self.st.etcds.get(p).map_or(0, |e| e.client_port);
        let (d, j) = (self.st.link_delay_ms, self.st.link_jitter_ms);
        let log = self.path(&format!("logs/link-{r}-{p}.log"));
        self.log_line(
            &log,
            &format!("start link {r}->{p} :{port} -> :{up} ({d}ms + 0..{j}ms)"),
        );
        let mut cmd = Command::new(self.e2e_bin());
        cmd.arg("--state").arg(&self.dir).arg("link-proxy");
        cmd.args([
            port.to_string(),
            up.to_string(),
            d.to_string(),
            j.to_string(),
        ]);
        let pid = spawn_detached(cmd, &log)?;
        self.st.links.insert(key, PortPid { port, pid });
        self.save();
        Ok(())
    }

    /// Starts R->P's proxy (`fresh`: on a new port) and waits until it
    /// listens; one that exited (port taken) is started again, on a new
    /// port if `fresh`, else on the same port after a second.
    pub(crate) fn wait_link(&mut self, fresh: bool, r: &str, p: &str) -> Result<(), String> {
        let key = format!("{r}>{p}");
        if fresh {
            self.st.links.insert(
                key.clone(),
                PortPid {
                    port: free_port(),
                    pid: 0,
                },
            );
        }
        self.link_start(r, p)?;
        let mut attempt = 1;
        let mut deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let l = self.st.links[&key];
            if alive(l.pid) && listens(l.pid, l.port) {
                return Ok(());
            }
            if !alive(l.pid) {
                attempt += 1;
                if attempt > 5 {
                    return Err(format!("link {r}->{p} did not start after 5 attempts"));
                }
                eprintln!(
                    "  link {r}->{p} exited (port taken?); starting it again (attempt {attempt})"
                );
                if fresh {
                    self.st.links.insert(
                        key.clone(),
                        PortPid {
                            port: free_port(),
                            pid: 0,
                        },
                    );
                } else {
                    sleep(Duration::from_secs(1));
                }
                self.link_start(r, p)?;
                deadline = Instant::now() + Duration::from_secs(10);
            } else if Instant::now() >= deadline {
                return Err(format!(
                    "link {r}->{p} (pid {}) did not listen on :{} within 10s",
                    l.pid, l.port
                ));
            }
            sleep(Duration::from_millis(100));
        }
    }

    pub(crate) fn start_links(&mut self) -> Result<(), String> {
        let mut desc = Vec::new();
        for r in self.st.regions.clone() {
            for p in self.peers_of(&r) {
                self.wait_link(true, &r, &p)?;
                desc.push(format!(
                    "{r}->{p} :{}",
                    self.link(&r, &p).map_or(0, |l| l.port)
                ));
            }
        }
        println!(
            "  links: every R->P through its own proxy, {}ms + 0..{}ms each way ({})",
            self.st.link_delay_ms,
            self.st.link_jitter_ms,
            desc.join(" ")
        );
        Ok(())
    }

    fn link_check(&self, r: &str, p: &str) {
        if r.is_empty() || p.is_empty() || r == p {
            crate::die("cut/heal need two different regions: REGION PEER");
        }
        let rs = &self.st.regions;
        if !rs.iter().any(|x| x == r) || !rs.iter().any(|x| x == p) {
            crate::die(format!("no link {r}->{p} (regions: {})", rs.join(" ")));
        }
        if self.link(r, p).is_none() {
            crate::die(format!(
                "{} has no link proxies: run up with --link-delay MS",
                self.dir.display()
            ));
        }
    }

    pub(crate) fn link_cut(&mut self, r: &str, p: &str) -> Result<String, String> {
        let l = self.link(r, p).unwrap_or_default();
        if ours(&self.dir_str(), l.pid) && !stop_pids(&self.dir_str(), &[l.pid]).is_empty() {
            return Err(format!(
                "the proxy of {r}->{p} (pid {}) did not stop",
                l.pid
            ));
        }
        Ok(format!(
            "cut {r}->{p} (proxy :{}, pid {} stopped)",
            l.port, l.pid
        ))
    }

    pub(crate) fn link_heal(&mut self, r: &str, p: &str) -> Result<String, String> {
        let l = self.link(r, p).unwrap_or_default();
        if ours(&self.dir_str(), l.pid) {
            return Ok(format!("link {r}->{p} is not cut (proxy pid {})", l.pid));
        }
        self.wait_link(false, r, p)?;
        let l = self.link(r, p).unwrap_or_default();
        Ok(format!(
            "healed {r}->{p} (proxy :{}, pid {})",
            l.port, l.pid
        ))
    }
}

pub(crate) fn cmd_cut(dir: PathBuf, r: &str, p: &str) {
    let mut m = Mesh::load_or_die(dir, "");
    m.link_check(r, p);
    match m.link_cut(r, p) {
        Ok(line) => println!("{line}"),
        Err(e) => crate::die(e),
    }
}

pub(crate) fn cmd_heal(dir: PathBuf, r: &str, p: &str) {
    let mut m = Mesh::load_or_die(dir, "");
    m.link_check(r, p);
    match m.link_heal(r, p) {
        Ok(line) => println!("{line}"),
        Err(e) => crate::die(format!("the proxy of {r}->{p} did not start again: {e}")),
    }
}

/// A small xorshift generator: the jitter needs spread, not quality.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new() -> Rng {
        let t = crate::state::now_ms() ^ (u64::from(std::process::id()) << 32);
        Rng(t | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One direction of a connection: a reader that stamps every chunk with
/// its due time (never before the chunk ahead of it: order is kept, as
/// TCP's would be), and a writer that sends each when due. Reading and
/// delayed writing run concurrently, so the latency does not cut
/// throughput.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration, jitter_ms: u64) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    spawn(move || {
        let mut rng = Rng::new();
        let mut last = Instant::now();
        let mut buf = vec![0u8; 65536];
        loop {
            // A read error ends the direction as an EOF would.
            let n = from.read(&mut buf).unwrap_or(0);
            let mut due = Instant::now() + delay;
            if jitter_ms > 0 {
                due += Duration::from_secs_f64(rng.unit() * jitter_ms as f64 / 1000.0);
            }
            last = last.max(due);
            // A send error: the writer is gone (its peer failed).
            if tx.send((last, buf[..n].to_vec())).is_err() || n == 0 {
                return;
            }
        }
    });
    spawn(move || {
        for (due, data) in rx {
            let now = Instant::now();
            if due > now {
                sleep(due - now);
            }
            if data.is_empty() {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            if to.write_all(&data).is_err() {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
        }
    });
}

/// `aether-e2e link-proxy LISTEN UPSTREAM ONE_WAY_MS [JITTER_MS]`: serves
/// until killed (SIGTERM's default action ends it, and with it every
/// connection: that is how a link is cut).
pub(crate) fn run_proxy(listen: u16, upstream: u16, one_way_ms: u64, jitter_ms: u64) {
    let l = match TcpListener::bind(("127.0.0.1", listen)) {
        Ok(l) => l,
        Err(e) => crate::die(format!(
            "link-proxy: cannot listen on 127.0.0.1:{listen}: {e}"
        )),
    };
    println!("ready");
    let delay = Duration::from_millis(one_way_ms);
    for conn in l.incoming() {
        let Ok(client) = conn else { continue };
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        pipe(client, s2, delay, jitter_ms);
        pipe(server, c2, delay, jitter_ms);
    }
}

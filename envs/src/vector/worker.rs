//! The worker side of [`super::Placement::Workers`]: a process that builds its share of the
//! envs with [`crate::make`] and steps them on its parent's command.
use std::fs::File;
use std::io::{self, BufReader};
use std::os::fd::{FromRawFd, OwnedFd};

use memmap2::MmapMut;

use super::protocol::{self, Decoder, Encoder, Layout};
use crate::{Env, EnvOptions, ObsKind, Result, TaskMix};

/// Error texts longer than this are cut (a frame must stay small).
const MAX_ERROR_BYTES: usize = 64 * 1024;

/// Serves the envs a parent asks for until the parent closes the channel (EOF on stdin).
///
/// Replies go to the process's original stdout; stdout itself is pointed at stderr first,
/// so whatever the environments print cannot corrupt the channel.
pub fn serve_worker() -> Result<()> {
    // Environments of another family's venv (a multitask slot's) step in workers of this
    // same program.
    if let Ok(program) = crate::running_binary::path() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        super::set_default_worker(super::WorkerCommand::new(program, &args));
    }
    let replies = protocol_output().map_err(|e| io_error("redirect stdout", e))?;
    let mut worker = Worker {
        replies,
        envs: Vec::new(),
        region: None,
    };
    let mut commands = BufReader::new(io::stdin().lock());
    loop {
        match protocol::read_frame(&mut commands) {
            Ok(Some((tag, payload))) => worker
                .handle(tag, &payload)
                .map_err(|e| io_error("answer the parent", e))?,
            Ok(None) => return Ok(()),
            Err(e) => return Err(io_error("read a command", e)),
        }
    }
}

fn io_error(what: &str, e: io::Error) -> crate::Error {
    crate::Error::WorkerChannel(format!("cannot {what}: {e}"))
}

/// A close-on-exec copy of stdout for the replies; stdout (fd 1) then becomes stderr.
fn protocol_output() -> io::Result<File> {
    // SAFETY: plain descriptor calls on descriptors this process owns; the duplicate is
    // owned by the returned File and nothing else.
    unsafe {
        let fd = libc::fcntl(libc::STDOUT_FILENO, libc::F_DUPFD_CLOEXEC, 3);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let out = File::from(OwnedFd::from_raw_fd(fd));
        if libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(out)
    }
}

struct Worker {
    replies: File,
    envs: Vec<Box<dyn Env>>,
    region: Option<(MmapMut, Layout)>,
}

/// What went wrong with a command: the env it concerns (local index) and the error text.
type Failure = (Option<usize>, String);

impl Worker {
    fn handle(&mut self, tag: u8, payload: &[u8]) -> io::Result<()> {
        let mut d = Decoder(payload);
        let outcome = match tag {
            protocol::INIT => self.init(&mut d),
            protocol::MAP => self.map().map(|()| Vec::new()),
            protocol::RESET => self.reset(&mut d).map(|()| Vec::new()),
            protocol::STEP => self.step(&mut d).map(|()| Vec::new()),
            protocol::RENDER => self.render(&mut d),
            protocol::SWITCH => self.switch_task(&mut d).map(|()| Vec::new()),
            protocol::SPECS => specs(&mut d),
            other => Err((None, format!("unknown command {other}"))),
        };
        match outcome {
            Ok(reply) => protocol::write_frame(&mut self.replies, protocol::OK, &reply),
            Err((env, mut text)) => {
                if text.len() > MAX_ERROR_BYTES {
                    let mut cut = MAX_ERROR_BYTES;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                }
                let index = env.map_or(protocol::NO_ENV, |i| i as u32);
                let mut reply = Encoder::default().u32(index).0;
                reply.extend_from_slice(text.as_bytes());
                protocol::write_frame(&mut self.replies, protocol::ERR, &reply)
            }
        }
    }

    fn init(&mut self, d: &mut Decoder<'_>) -> std::result::Result<Vec<u8>, Failure> {
        let EnvOptions { obs, videos } = read_options(d)?;
        let count = d.u32().map_err(malformed)?;
        let envs: Vec<(u64, TaskMix)> = (0..count)
            .map(|_| Ok((d.u64()?, protocol::decode_mix(d)?)))
            .collect::<io::Result<_>>()
            .map_err(malformed)?;
        if !self.envs.is_empty() || envs.is_empty() {
            return Err((None, "INIT must come once, with at least one env".into()));
        }
        for (i, (seed, mix)) in envs.iter().enumerate() {
            // Videos film the parent's env 0, this worker's first when it has it.
            let options = EnvOptions {
                obs,
                videos: videos && i == 0,
            };
            let env = mix
                .make(*seed, options)
                .map_err(|e| (Some(i), e.to_string()))?;
            self.envs.push(env);
        }
        let spec = super::common_spec(self.envs.iter().map(|e| e.spec())).map_err(|(a, b)| {
            (
                None,
                format!("environments of different shapes: {a:?} and {b:?}"),
            )
        })?;
        Ok(protocol::encode_spec(&spec))
    }

    fn switch_task(&mut self, d: &mut Decoder<'_>) -> std::result::Result<(), Failure> {
        let env = d.u32().map_err(malformed)? as usize;
        let task = d.u32().map_err(malformed)? as usize;
        self.envs
            .get_mut(env)
            .ok_or((None, format!("no env {env}")))?
            .switch_task(task)
            .map_err(|e| (Some(env), e.to_string()))
    }

    fn map(&mut self) -> std::result::Result<(), Failure> {
        let spec = self
            .envs
            .first()
            .ok_or((None, "MAP before INIT".to_string()))?
            .spec();
        let layout = Layout::new(spec);
        // SAFETY: the parent hands the region over as SHM_FD before exec and only touches
        // an env's slot while this worker is not working on it (it waits for our reply).
        let file = unsafe { File::from_raw_fd(protocol::SHM_FD) };
        let map = unsafe { MmapMut::map_mut(&file) }
            .map_err(|e| (None, format!("cannot map the shared region: {e}")))?;
        if map.len() < layout.size(self.envs.len()) {
            return Err((None, format!("shared region has {} bytes", map.len())));
        }
        self.region = Some((map, layout));
        Ok(())
    }

    fn reset(&mut self, d: &mut Decoder<'_>) -> std::result::Result<(), Failure> {
        let env = d.u32().map_err(malformed)? as usize;
        let seed = match d.u8().map_err(malformed)? {
            0 => None,
            _ => Some(d.u64().map_err(malformed)?),
        };
        let (map, layout) = self.region.as_mut().ok_or((None, unmapped()))?;
        let target = self
            .envs
            .get_mut(env)
            .ok_or((None, format!("no env {env}")))?;
        let obs = target.reset(seed).map_err(|e| (Some(env), e.to_string()))?;
        if !layout.fits_obs(&obs) {
            return Err((Some(env), wrong_obs(obs.len())));
        }
        layout.write_obs(map, env, &obs);
        Ok(())
    }

    fn render(&mut self, d: &mut Decoder<'_>) -> std::result::Result<Vec<u8>, Failure> {
        let env = d.u32().map_err(malformed)? as usize;
        let size = d.u32().map_err(malformed)? as usize;
        let target = self
            .envs
            .get_mut(env)
            .ok_or((None, format!("no env {env}")))?;
        let frame = target
            .render(size)
            .map_err(|e| (Some(env), e.to_string()))?;
        Ok(protocol::encode_frame(&frame))
    }

    fn step(&mut self, d: &mut Decoder<'_>) -> std::result::Result<(), Failure> {
        let count = d.u32().map_err(malformed)?;
        let (map, layout) = self.region.as_mut().ok_or((None, unmapped()))?;
        for _ in 0..count {
            let env = d.u32().map_err(malformed)? as usize;
            let target = self
                .envs
                .get_mut(env)
                .ok_or((None, format!("no env {env}")))?;
            let action = layout.read_action(map, env);
            let step = target
                .step(&action)
                .map_err(|e| (Some(env), e.to_string()))?;
            if !layout.fits_obs(&step.obs) {
                return Err((Some(env), wrong_obs(step.obs.len())));
            }
            layout.write_step(map, env, &step);
        }
        Ok(())
    }
}

/// What the agent observes and whether videos are filmed, as INIT and SPECS begin.
fn read_options(d: &mut Decoder<'_>) -> std::result::Result<EnvOptions, Failure> {
    let obs = match d.u8().map_err(malformed)? {
        0 => ObsKind::State,
        1 => ObsKind::Rgb,
        other => return Err((None, format!("the command names observation kind {other}"))),
    };
    let videos = d.u8().map_err(malformed)? != 0;
    Ok(EnvOptions { obs, videos })
}

/// Each named task's spec; the environments are dropped at once.
fn specs(d: &mut Decoder<'_>) -> std::result::Result<Vec<u8>, Failure> {
    let options = read_options(d)?;
    let seed = d.u64().map_err(malformed)?;
    let count = d.u32().map_err(malformed)?;
    let mut reply = Vec::new();
    for i in 0..count as usize {
        let task = d.str().map_err(malformed)?;
        let env = crate::make_observed(&task, seed, options)
            .map_err(|e| (Some(i), format!("{task}: {e}")))?;
        reply.extend(protocol::encode_spec(env.spec()));
    }
    Ok(reply)
}

fn malformed(e: io::Error) -> Failure {
    (None, format!("malformed command: {e}"))
}

fn unmapped() -> String {
    "command before MAP".into()
}

fn wrong_obs(len: usize) -> String {
    format!("observation has {len} components, unlike the env's spec")
}

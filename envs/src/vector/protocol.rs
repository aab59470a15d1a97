//! What a parent and its environment workers say to each other.
//!
//! Commands and replies are small frames on the worker's stdin and on a copy of its stdout
//! (`tag: u8, len: u32 LE, payload`). Actions, observations, rewards and flags never travel
//! in them: they sit in a shared memory region laid out by [`Layout`], written by one side
//! while the other waits for a frame.
use std::io::{self, Read, Write};

use crate::{EnvSpec, Frame, Padding, Step, TaskMix};

/// Parent -> worker: observation kind, videos, then one construction seed and [`TaskMix`] per
/// env; the reply carries the spec.
pub const INIT: u8 = 1;
/// Parent -> worker: map the shared region (inherited as [`SHM_FD`]), now sized for the spec.
pub const MAP: u8 = 2;
/// Parent -> worker: reset one env; its observation goes to its slot.
pub const RESET: u8 = 3;
/// Parent -> worker: step the listed envs with the actions in their slots, in turn.
pub const STEP: u8 = 4;
/// Parent -> worker: render one env at a size; the reply carries the frame (videos only:
/// pixel observations travel in the shared region like any observation).
pub const RENDER: u8 = 5;
/// Parent -> worker: which task of its mix one env's next reset starts.
pub const SWITCH: u8 = 6;
/// Parent -> worker (instead of INIT): observation kind, videos, a seed and task names; the
/// worker makes each task's environment in turn and replies with their specs, keeping none.
pub const SPECS: u8 = 7;
/// Worker -> parent: done (after INIT: the spec).
pub const OK: u8 = 0x80;
/// Worker -> parent: an env failed: its local index (or [`NO_ENV`]) and the error text.
pub const ERR: u8 = 0x81;
/// The local index of an error that concerns no single env.
pub const NO_ENV: u32 = u32::MAX;

/// What a command asks for, in words (for errors).
pub fn command_name(tag: u8) -> &'static str {
    match tag {
        INIT => "build its environments",
        MAP => "map the shared memory",
        RESET => "reset",
        STEP => "step",
        RENDER => "render",
        SWITCH => "switch task",
        SPECS => "make each task's environment",
        _ => "an unknown command",
    }
}

/// The worker's file descriptor of the shared memory region.
pub const SHM_FD: i32 = 3;

/// Frames larger than this are a broken channel, not a message.
const MAX_FRAME: u32 = 1 << 24;

pub fn write_frame(out: &mut impl Write, tag: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&len| len <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut frame = Vec::with_capacity(5 + payload.len());
    frame.push(tag);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(payload);
    out.write_all(&frame)?;
    out.flush()
}

/// The next frame, or None at a clean end of the channel (EOF before a frame starts).
pub fn read_frame(input: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    let mut filled = 0;
    while filled < head.len() {
        match input.read(&mut head[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_FRAME {
        return Err(invalid(format!("frame of {len} bytes")));
    }
    let mut payload = vec![0u8; len as usize];
    input.read_exact(&mut payload)?;
    Ok(Some((head[0], payload)))
}

pub fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Appends little-endian fields to a payload.
#[derive(Default)]
pub struct Encoder(pub Vec<u8>);

impl Encoder {
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn str(self, s: &str) -> Self {
        let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
        let mut this = self.u32(len);
        this.0.extend_from_slice(&s.as_bytes()[..len as usize]);
        this
    }
}

/// Reads the fields an [`Encoder`] wrote; running out is an error.
pub struct Decoder<'a>(pub &'a [u8]);

impl Decoder<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(invalid("truncated message".into()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> io::Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    pub fn str(&mut self) -> io::Result<String> {
        let len = self.u32()? as usize;
        String::from_utf8(self.take(len)?.to_vec()).map_err(|e| invalid(e.to_string()))
    }
    pub fn rest(&mut self) -> &[u8] {
        std::mem::take(&mut self.0)
    }
}

/// A mix as INIT carries it: its task count and names, then 0, or 1 and the padding.
pub fn encode_mix(encoder: Encoder, mix: &TaskMix) -> Encoder {
    let mut encoder = encoder.u32(mix.tasks.len() as u32);
    for task in &mix.tasks {
        encoder = encoder.str(task);
    }
    match mix.padding {
        None => encoder.u8(0),
        Some(p) => encoder.u8(1).u32(p.obs_dim as u32).u32(p.action_dim as u32),
    }
}

pub fn decode_mix(d: &mut Decoder<'_>) -> io::Result<TaskMix> {
    let count = d.u32()?;
    let tasks = (0..count).map(|_| d.str()).collect::<io::Result<_>>()?;
    let padding = match d.u8()? {
        0 => None,
        _ => Some(Padding {
            obs_dim: d.u32()? as usize,
            action_dim: d.u32()? as usize,
        }),
    };
    Ok(TaskMix { tasks, padding })
}

pub fn encode_spec(spec: &EnvSpec) -> Vec<u8> {
    let mut e = Encoder::default().u32(spec.obs_shape.len() as u32);
    for &d in &spec.obs_shape {
        e = e.u64(d as u64);
    }
    e.u64(spec.action_dim as u64)
        .u64(spec.episode_length as u64)
        .0
}

pub fn decode_spec(payload: &[u8]) -> io::Result<EnvSpec> {
    read_spec(&mut Decoder(payload))
}

/// The next spec [`encode_spec`] wrote.
pub fn read_spec(d: &mut Decoder<'_>) -> io::Result<EnvSpec> {
    let rank = d.u32()?;
    let obs_shape = (0..rank)
        .map(|_| d.u64().map(|v| v as usize))
        .collect::<io::Result<_>>()?;
    Ok(EnvSpec {
        obs_shape,
        action_dim: d.u64()? as usize,
        episode_length: d.u64()? as usize,
    })
}

pub fn encode_frame(frame: &Frame) -> Vec<u8> {
    let mut e = Encoder::default()
        .u32(frame.height as u32)
        .u32(frame.width as u32);
    e.0.extend_from_slice(&frame.rgb);
    e.0
}

pub fn decode_frame(payload: &[u8]) -> io::Result<Frame> {
    let mut d = Decoder(payload);
    let (height, width) = (d.u32()? as usize, d.u32()? as usize);
    let rgb = d.rest().to_vec();
    let expected = height.checked_mul(width).and_then(|p| p.checked_mul(3));
    if expected != Some(rgb.len()) {
        return Err(invalid(format!(
            "{} bytes for a {height}x{width} RGB frame",
            rgb.len()
        )));
    }
    Ok(Frame { height, width, rgb })
}

/// Where each env's data lives in a worker's shared region: one slot per env, holding the
/// action, the observation, then reward, terminated, truncated and success as f64s
/// (NaN success = none). Values are copied in and out byte-wise, so no alignment is assumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    action_dim: usize,
    obs_dim: usize,
}

const SCALARS: usize = 4;

impl Layout {
    pub fn new(spec: &EnvSpec) -> Self {
        Self {
            action_dim: spec.action_dim,
            obs_dim: spec.obs_dim(),
        }
    }

    fn obs_offset(&self) -> usize {
        4 * self.action_dim
    }

    fn scalar_offset(&self) -> usize {
        self.obs_offset() + 4 * self.obs_dim
    }

    fn stride(&self) -> usize {
        self.scalar_offset() + 8 * SCALARS
    }

    /// Bytes of a region with `envs` slots.
    pub fn size(&self, envs: usize) -> usize {
        self.stride() * envs
    }

    fn slot<'a>(&self, region: &'a [u8], env: usize) -> &'a [u8] {
        &region[env * self.stride()..(env + 1) * self.stride()]
    }

    fn slot_mut<'a>(&self, region: &'a mut [u8], env: usize) -> &'a mut [u8] {
        &mut region[env * self.stride()..(env + 1) * self.stride()]
    }

    pub fn write_action(&self, region: &mut [u8], env: usize, action: &[f32]) {
        let slot = self.slot_mut(region, env);
        write_f32s(&mut slot[..self.obs_offset()], action);
    }

    pub fn read_action(&self, region: &[u8], env: usize) -> Vec<f32> {
        read_f32s(&self.slot(region, env)[..self.obs_offset()])
    }

    pub fn write_obs(&self, region: &mut [u8], env: usize, obs: &[f32]) {
        let slot = self.slot_mut(region, env);
        write_f32s(&mut slot[self.obs_offset()..self.scalar_offset()], obs);
    }

    pub fn read_obs(&self, region: &[u8], env: usize) -> Vec<f32> {
        read_f32s(&self.slot(region, env)[self.obs_offset()..self.scalar_offset()])
    }

    pub fn write_step(&self, region: &mut [u8], env: usize, step: &Step) {
        self.write_obs(region, env, &step.obs);
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        let scalars = [
            step.reward,
            flag(step.terminated),
            flag(step.truncated),
            step.success.unwrap_or(f64::NAN),
        ];
        let at = self.scalar_offset();
        let slot = self.slot_mut(region, env);
        for (chunk, v) in slot[at..].chunks_exact_mut(8).zip(scalars) {
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
    }

    pub fn read_step(&self, region: &[u8], env: usize) -> Step {
        let slot = self.slot(region, env);
        let mut scalars = [0.0f64; SCALARS];
        for (v, chunk) in scalars
            .iter_mut()
            .zip(slot[self.scalar_offset()..].chunks_exact(8))
        {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *v = f64::from_ne_bytes(b);
        }
        Step {
            obs: self.read_obs(region, env),
            reward: scalars[0],
            terminated: scalars[1] != 0.0,
            truncated: scalars[2] != 0.0,
            success: Some(scalars[3]).filter(|s| !s.is_nan()),
        }
    }

    /// Whether `obs` fits this layout's observation slot.
    pub fn fits_obs(&self, obs: &[f32]) -> bool {
        obs.len() == self.obs_dim
    }
}

fn write_f32s(bytes: &mut [u8], values: &[f32]) {
    for (chunk, v) in bytes.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
}

fn read_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_eof_is_clean_only_between_frames() {
        let mut wire = Vec::new();
        write_frame(&mut wire, STEP, &Encoder::default().u32(7).str("hé").0).unwrap();
        write_frame(&mut wire, OK, &[]).unwrap();
        let mut input = wire.as_slice();
        let (tag, payload) = read_frame(&mut input).unwrap().unwrap();
        let mut d = Decoder(&payload);
        assert_eq!(
            (tag, d.u32().unwrap(), d.str().unwrap()),
            (STEP, 7, "hé".into())
        );
        assert!(d.u8().is_err(), "reading past the payload is an error");
        assert_eq!(read_frame(&mut input).unwrap(), Some((OK, vec![])));
        assert_eq!(read_frame(&mut input).unwrap(), None);
        let cut = &wire[..3];
        assert!(read_frame(&mut &cut[..]).is_err(), "EOF inside a frame");
    }

    #[test]
    fn spec_and_slots_round_trip() {
        let spec = EnvSpec {
            obs_shape: vec![3],
            action_dim: 2,
            episode_length: 500,
        };
        assert_eq!(decode_spec(&encode_spec(&spec)).unwrap(), spec);
        let frame = Frame {
            height: 2,
            width: 1,
            rgb: vec![1, 2, 3, 4, 5, 6],
        };
        assert_eq!(decode_frame(&encode_frame(&frame)).unwrap(), frame);
        assert!(
            decode_frame(&encode_frame(&frame)[..9]).is_err(),
            "short frame"
        );
        let layout = Layout::new(&spec);
        let mut region = vec![0u8; layout.size(2)];
        let step = Step {
            obs: vec![1.5, -2.0, f32::MIN_POSITIVE],
            reward: -0.25,
            terminated: false,
            truncated: true,
            success: None,
        };
        layout.write_action(&mut region, 1, &[0.5, -1.0]);
        layout.write_step(&mut region, 1, &step);
        layout.write_step(
            &mut region,
            0,
            &Step {
                success: Some(1.0),
                terminated: true,
                ..step.clone()
            },
        );
        assert_eq!(layout.read_action(&region, 1), vec![0.5, -1.0]);
        assert_eq!(layout.read_step(&region, 1), step);
        let first = layout.read_step(&region, 0);
        assert_eq!((first.success, first.terminated), (Some(1.0), true));
    }
}

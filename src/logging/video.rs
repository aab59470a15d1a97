//! Evaluation videos: frames handed over by the trainer are encoded and written to
//! `<run_dir>/eval_video/` on a thread of their own, so that training goes on meanwhile; the
//! logger hands each finished video to the sinks in step order.
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use envs::Frame;

use super::gif;
use crate::error::{panic_message, Error, Result};

/// Frames a second of an evaluation video (the official recorder's).
pub const VIDEO_FPS: u32 = 15;
/// The tracker key of evaluation videos (the official one).
pub const VIDEO_TAG: &str = "videos/eval_video";
/// The run directory's folder of videos (the official one).
pub const VIDEO_DIR: &str = "eval_video";

/// One written video.
#[derive(Debug, Clone)]
pub struct Video {
    pub step: u64,
    pub path: PathBuf,
    /// The file's bytes (an animated GIF).
    pub gif: Vec<u8>,
    pub width: usize,
    pub height: usize,
    pub frames: usize,
}

/// The file of the video of the evaluation at `step`.
pub fn video_path(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join(VIDEO_DIR).join(format!("step_{step:010}.gif"))
}

type Job = (u64, Vec<Frame>);
/// Writes one video: [`write`], or in tests one that fails its own way.
type WriteVideo = fn(&Path, u64, &[Frame]) -> Result<Video>;

/// Encodes and writes videos in the background, one at a time, in the order given.
pub(super) struct VideoWriter {
    run_dir: PathBuf,
    write: WriteVideo,
    /// Started with the first video.
    worker: Option<Worker>,
    /// Steps of the videos handed over and not yet collected, oldest first.
    pending: VecDeque<u64>,
}

struct Worker {
    jobs: Option<Sender<Job>>,
    done: Receiver<Result<Video>>,
    thread: Option<JoinHandle<()>>,
}

impl VideoWriter {
    pub(super) fn new(run_dir: &Path) -> Self {
        Self::writing_with(run_dir, write)
    }

    fn writing_with(run_dir: &Path, write: WriteVideo) -> Self {
        Self {
            run_dir: run_dir.to_owned(),
            write,
            worker: None,
            pending: VecDeque::new(),
        }
    }

    /// Hands over the frames of the evaluation at `step`.
    pub(super) fn submit(&mut self, step: u64, frames: Vec<Frame>) -> Result<()> {
        if self.worker.is_none() {
            self.worker = Some(Worker::start(&self.run_dir, self.write)?);
        }
        let worker = self.worker.as_mut().expect("started above");
        worker
            .jobs
            .as_ref()
            .and_then(|jobs| jobs.send((step, frames)).ok())
            .ok_or_else(|| Error::Other("the video writer thread has stopped".into()))?;
        self.pending.push_back(step);
        Ok(())
    }

    /// The videos finished so far, oldest first, after waiting for every one of a step
    /// before `before` (all of them when `None`).
    pub(super) fn collect(&mut self, before: Option<u64>) -> Vec<Result<Video>> {
        let mut out = Vec::new();
        let Some(worker) = &self.worker else {
            return out;
        };
        while let Some(&step) = self.pending.front() {
            let must_wait = before.is_none_or(|b| step < b);
            let next = if must_wait {
                worker.done.recv().ok()
            } else {
                worker.done.try_recv().ok()
            };
            match next {
                Some(video) => {
                    self.pending.pop_front();
                    out.push(video);
                }
                None if must_wait => {
                    self.pending.clear();
                    out.push(Err(Error::Other(format!(
                        "the video writer thread stopped before the video of step {step}"
                    ))));
                }
                None => break,
            }
        }
        out
    }
}

impl Worker {
    fn start(run_dir: &Path, write: WriteVideo) -> Result<Self> {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (outbox, done) = mpsc::channel();
        let run_dir = run_dir.to_owned();
        let thread = std::thread::Builder::new()
            .name("video-writer".into())
            .spawn(move || {
                for (step, frames) in inbox {
                    if outbox
                        .send(written(write, &run_dir, step, &frames))
                        .is_err()
                    {
                        return;
                    }
                }
            })
            .map_err(|e| Error::io("start the video writer thread", e))?;
        Ok(Self {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }
}

impl Drop for Worker {
    /// Lets the videos handed over finish, so that no file is left half written.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Encodes `frames` as a video at `path` (its folder created), written atomically: a
/// temporary file renamed into place. Returns the file's bytes.
pub fn write_video(path: &Path, frames: &[Frame]) -> Result<Vec<u8>> {
    let gif = gif::encode(frames, VIDEO_FPS)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    }
    let partial = path.with_extension(format!("gif.{}.partial", std::process::id()));
    let _watched = crate::partial_files::watch(&partial);
    std::fs::write(&partial, &gif)
        .and_then(|()| std::fs::rename(&partial, path))
        .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    Ok(gif)
}

/// `write`'s video, with a panic in it as an error: a video is not worth the run, and the
/// thread goes on to the next.
fn written(write: WriteVideo, run_dir: &Path, step: u64, frames: &[Frame]) -> Result<Video> {
    std::panic::catch_unwind(|| write(run_dir, step, frames)).unwrap_or_else(|panic| {
        Err(Error::Other(format!(
            "writing the video of step {step} failed: {}",
            panic_message(panic.as_ref())
        )))
    })
}

fn write(run_dir: &Path, step: u64, frames: &[Frame]) -> Result<Video> {
    let path = video_path(run_dir, step);
    let gif = write_video(&path, frames)?;
    let first = &frames[0];
    Ok(Video {
        step,
        path,
        gif,
        width: first.width,
        height: first.height,
        frames: frames.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(n: usize) -> Vec<Frame> {
        (0..n)
            .map(|i| Frame {
                height: 4,
                width: 6,
                rgb: vec![(i * 20) as u8; 4 * 6 * 3],
            })
            .collect()
    }

    #[test]
    fn videos_come_back_in_step_order_once_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = VideoWriter::new(dir.path());
        assert!(writer.collect(None).is_empty(), "nothing handed over");
        writer.submit(100, frames(3)).unwrap();
        writer.submit(200, frames(5)).unwrap();
        let first = writer.collect(Some(101));
        assert!(!first.is_empty(), "the video of step 100 is waited for");
        let mut all: Vec<Video> = first.into_iter().map(Result::unwrap).collect();
        all.extend(writer.collect(None).into_iter().map(Result::unwrap));
        let steps: Vec<(u64, usize)> = all.iter().map(|v| (v.step, v.frames)).collect();
        assert_eq!(steps, [(100, 3), (200, 5)]);
        for video in &all {
            assert_eq!(std::fs::read(&video.path).unwrap(), video.gif);
            assert_eq!((video.width, video.height), (6, 4));
        }
        assert_eq!(
            all[1].path,
            dir.path().join("eval_video/step_0000000200.gif")
        );
    }

    #[test]
    fn a_bad_video_is_an_error_and_the_next_still_writes() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = VideoWriter::new(dir.path());
        writer.submit(1, Vec::new()).unwrap();
        writer.submit(2, frames(2)).unwrap();
        let results = writer.collect(None);
        assert!(results[0].is_err(), "no frames");
        assert_eq!(results[1].as_ref().unwrap().step, 2);
        assert!(!video_path(dir.path(), 1).exists());
    }

    #[test]
    fn a_panic_while_writing_is_that_video_s_error_and_the_thread_goes_on() {
        fn panics_on_step_one(run_dir: &Path, step: u64, frames: &[Frame]) -> Result<Video> {
            assert_ne!(step, 1, "the encoder broke");
            write(run_dir, step, frames)
        }
        let dir = tempfile::tempdir().unwrap();
        let mut writer = VideoWriter::writing_with(dir.path(), panics_on_step_one);
        writer.submit(1, frames(2)).unwrap();
        let first = writer.collect(None);
        let error = first[0].as_ref().unwrap_err().to_string();
        assert!(
            error.contains("step 1") && error.contains("the encoder broke"),
            "{error}"
        );
        writer.submit(2, frames(2)).unwrap();
        let second = writer.collect(None);
        assert_eq!(second[0].as_ref().unwrap().step, 2);
    }
}

//! CPU affinity of the ranks a launcher starts on one machine.
//!
//! The launcher splits the CPUs it may use into one contiguous slice per local rank and hands
//! each rank its slice in `TDMPC2_CPUS`. After joining the process group, the rank pins its
//! main thread there (its OpenMP threads, started later, inherit the slice; the collectives'
//! threads, started before, stay free to use any CPU). Unpinned, the ranks' compute threads
//! were preempted about 4× as often by the collectives' threads and moved between cores
//! (2–3 % slower per step with 2 ranks on 2 cores). Pinning is left to the user when ranks come
//! from torchrun or srun (`srun --cpu-bind`), whose CPU sets this process cannot see whole.
use crate::error::{Error, Result};

/// The variable through which the launcher gives a rank its CPUs, e.g. `0-3` or `0,2,4`.
pub const CPUS_ENV: &str = "TDMPC2_CPUS";

/// Splits `allowed` into `ranks` contiguous slices of equal size (the remainder CPUs go to
/// the first slices); `None` when there are fewer CPUs than ranks.
pub fn split(allowed: &[usize], ranks: usize) -> Option<Vec<Vec<usize>>> {
    if ranks == 0 || allowed.len() < ranks {
        return None;
    }
    let (base, extra) = (allowed.len() / ranks, allowed.len() % ranks);
    let mut rest = allowed;
    let slices = (0..ranks)
        .map(|r| {
            let (slice, tail) = rest.split_at(base + usize::from(r < extra));
            rest = tail;
            slice.to_vec()
        })
        .collect();
    Some(slices)
}

/// `[0, 1, 2, 5]` → `0-2,5`.
pub fn format_list(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// `0-2,5` → `[0, 1, 2, 5]`.
pub fn parse_list(text: &str) -> Result<Vec<usize>> {
    let bad = || {
        Error::Config(format!(
            "{CPUS_ENV}={text:?}: expected CPU numbers and ranges such as 0-3 or 0,2,4"
        ))
    };
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let number = |s: &str| s.trim().parse::<usize>().map_err(|_| bad());
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (number(first)?, number(last)?);
                if first > last || last >= libc::CPU_SETSIZE as usize {
                    return Err(bad());
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(number(part)?),
        }
    }
    if cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(bad());
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The CPUs our launcher allotted to this process (`TDMPC2_CPUS`), when our launcher started
/// it: a list inherited by a process it did not start (torchrun's ranks share their
/// environment) is nobody's own.
pub fn launcher_slice(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    var(super::lifeline::LAUNCHER_PID_ENV)?;
    var(CPUS_ENV)
}

/// The CPUs this thread may run on.
pub fn allowed_cpus() -> Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call only writes into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return Err(Error::io(
            "read this process's CPU affinity",
            std::io::Error::last_os_error(),
        ));
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Restricts the calling thread (and threads it starts afterwards) to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> Result<()> {
    // SAFETY: as above; CPU_SET is given numbers below CPU_SETSIZE (checked by parse_list).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    if unsafe { libc::sched_setaffinity(0, size, &set) } != 0 {
        return Err(Error::io(
            format!("pin to CPUs {} ({CPUS_ENV})", format_list(cpus)),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Pins the calling thread to the CPUs in `TDMPC2_CPUS`, if our launcher set it.
pub fn apply_from_env() -> Result<Option<Vec<usize>>> {
    let Some(text) = launcher_slice(|key| std::env::var(key).ok()) else {
        return Ok(None);
    };
    let cpus = parse_list(&text)?;
    pin_current_thread(&cpus)?;
    Ok(Some(cpus))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_gives_contiguous_even_slices() {
        let cpus: Vec<usize> = (0..8).collect();
        assert_eq!(
            split(&cpus, 3).unwrap(),
            vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]
        );
        assert_eq!(split(&[4, 5], 2).unwrap(), vec![vec![4], vec![5]]);
        assert_eq!(split(&[0, 1], 3), None);
        assert_eq!(split(&[0, 1], 0), None);
    }

    #[test]
    fn lists_round_trip() {
        for cpus in [vec![0], vec![0, 1, 2, 5], vec![3, 7, 8, 9]] {
            assert_eq!(parse_list(&format_list(&cpus)).unwrap(), cpus);
        }
        assert_eq!(format_list(&[0, 1, 2, 5]), "0-2,5");
        for bad in ["", "a", "3-1", "1,,2", "0-99999"] {
            let e = parse_list(bad).unwrap_err().to_string();
            assert!(e.contains(CPUS_ENV), "{bad}: {e}");
        }
    }

    #[test]
    fn a_pinned_thread_runs_only_on_its_cpus() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        let first = allowed[0];
        // A thread of its own, so that the test runner's threads keep their CPUs.
        let seen = std::thread::spawn(move || {
            pin_current_thread(&[first]).unwrap();
            let child = std::thread::spawn(allowed_cpus).join().unwrap();
            (allowed_cpus().unwrap(), child.unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(seen, (vec![first], vec![first]), "and threads it starts");
        let last = libc::CPU_SETSIZE as usize - 1;
        let refused = std::thread::spawn(move || pin_current_thread(&[last]))
            .join()
            .unwrap();
        if !allowed.contains(&last) {
            let e = refused.unwrap_err().to_string();
            assert!(e.contains(CPUS_ENV) && e.contains(&last.to_string()), "{e}");
        }
    }
}

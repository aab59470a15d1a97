//! Which task each environment of a multitask run plays, episode by episode.
//!
//! The run's W·n environments (W ranks, n each) are numbered g = i·W + r, as their seeds are,
//! and take the T tasks in turn: environment g plays task (g + k·W·n) mod T in its k-th
//! episode. When W·n is a multiple of T every environment keeps one task (3 tasks on 3 ranks:
//! rank r plays task r); otherwise they cycle, so that every task gets the same share of
//! episodes (3 tasks on 2 ranks with one environment each: rank 0 plays 0, 2, 1, 0, …).
//! An environment holds only the tasks it visits: T / gcd(W·n, T) of them.

/// The tasks of one rank's environments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskAssignment {
    /// Environment i's k-th episode plays `cycles[i][k mod cycles[i].len()]`.
    cycles: Vec<Vec<u32>>,
}

impl TaskAssignment {
    pub fn new(num_tasks: usize, world_size: usize, rank: usize, num_envs: usize) -> Self {
        let stride = world_size * num_envs;
        let period = num_tasks / gcd(stride, num_tasks);
        let cycles = (0..num_envs)
            .map(|i| {
                let g = i * world_size + rank;
                (0..period)
                    .map(|k| ((g + k * stride) % num_tasks) as u32)
                    .collect()
            })
            .collect();
        Self { cycles }
    }

    /// The tasks environment `env` plays, in the order of its episodes.
    pub fn cycle(&self, env: usize) -> &[u32] {
        &self.cycles[env]
    }

    /// Whether environment `env` plays `task` (its environment holds it).
    pub fn holds(&self, env: usize, task: u32) -> bool {
        self.cycles[env].contains(&task)
    }

    /// Where in its cycle environment `env`'s `episode`-th episode is, and its task.
    pub fn episode(&self, env: usize, episode: u64) -> (usize, u32) {
        let cycle = &self.cycles[env];
        let position = (episode % cycle.len() as u64) as usize;
        (position, cycle[position])
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a.max(1)
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks_of(t: usize, w: usize, r: usize, n: usize, episodes: u64) -> Vec<Vec<u32>> {
        let a = TaskAssignment::new(t, w, r, n);
        (0..n)
            .map(|i| (0..episodes).map(|k| a.episode(i, k).1).collect())
            .collect()
    }

    #[test]
    fn each_rank_keeps_its_task_when_they_divide_evenly() {
        for r in 0..3 {
            assert_eq!(tasks_of(3, 3, r, 2, 3), vec![vec![r as u32; 3]; 2]);
        }
        // More ranks than tasks: tasks repeat.
        assert_eq!(tasks_of(2, 4, 3, 1, 2), vec![vec![1, 1]]);
        let one = TaskAssignment::new(3, 3, 1, 1);
        assert_eq!(one.cycle(0), &[1]);
        assert!(one.holds(0, 1) && !one.holds(0, 0));
    }

    #[test]
    fn fewer_environments_than_tasks_cycle_an_episode_at_a_time() {
        assert_eq!(tasks_of(3, 2, 0, 1, 4), vec![vec![0, 2, 1, 0]]);
        assert_eq!(tasks_of(3, 2, 1, 1, 4), vec![vec![1, 0, 2, 1]]);
        assert_eq!(tasks_of(3, 1, 0, 1, 4), vec![vec![0, 1, 2, 0]]);
        // One rank's environments cover several tasks, each keeping its own.
        assert_eq!(
            tasks_of(3, 1, 0, 3, 2),
            vec![vec![0, 0], vec![1, 1], vec![2, 2]]
        );
    }

    #[test]
    fn every_task_gets_an_equal_share_of_the_first_episodes() {
        for (t, w, n) in [(3, 2, 1), (5, 2, 2), (4, 3, 2), (30, 4, 3)] {
            let mut counts = vec![0u64; t];
            let period = (t / gcd(w * n, t)) as u64;
            for r in 0..w {
                for cycle in tasks_of(t, w, r, n, period) {
                    cycle.iter().for_each(|&task| counts[task as usize] += 1);
                }
            }
            assert!(
                counts.iter().all(|&c| c == counts[0]),
                "{t} {w} {n}: {counts:?}"
            );
        }
    }
}

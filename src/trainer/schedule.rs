//! When evaluations and checkpoints fall due: at the first step at or after each multiple of
//! `eval_freq` and `save_freq` (global agent steps), the way the official trainer evaluates.
//! They happen once every environment of the rank is at an episode boundary.

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Schedule {
    eval_freq: Option<u64>,
    save_freq: u64,
    /// The global step of the last `advance`.
    previous_step: u64,
    eval_due: bool,
    save_due: bool,
}

impl Schedule {
    /// A fresh run: it evaluates first. Without evaluations (`eval_freq` None) nothing waits
    /// for them.
    pub(super) fn fresh(eval_freq: Option<u64>, save_freq: u64) -> Self {
        Self {
            eval_freq,
            save_freq,
            previous_step: 0,
            eval_due: eval_freq.is_some(),
            save_due: false,
        }
    }

    /// A run resumed from its checkpoint at global step `from`: it evaluated there unless
    /// `eval_due`, and made its periodic checkpoint unless `save_due` (a stop came first: that
    /// checkpoint is then made when it would have been, after the evaluation or at the
    /// episodes' end). Steps below `from` (a resume at another world size rounds the step
    /// down) cross no multiple again.
    pub(super) fn resumed(
        eval_freq: Option<u64>,
        save_freq: u64,
        from: u64,
        (eval_due, save_due): (bool, bool),
    ) -> Self {
        Self {
            previous_step: from,
            eval_due: eval_freq.is_some() && eval_due,
            save_due,
            ..Self::fresh(eval_freq, save_freq)
        }
    }

    /// Notes the multiples crossed since the last call (global steps).
    pub(super) fn advance(&mut self, step: u64) {
        if step > self.previous_step {
            self.eval_due |= self
                .eval_freq
                .is_some_and(|every| crossed(every, self.previous_step, step));
            self.save_due |= crossed(self.save_freq, self.previous_step, step);
            self.previous_step = step;
        }
    }

    pub(super) fn eval_due(&self) -> bool {
        self.eval_due
    }

    pub(super) fn save_due(&self) -> bool {
        self.save_due
    }

    /// Whether environments wait at their episode boundary for an evaluation or a checkpoint.
    pub(super) fn any_due(&self) -> bool {
        self.eval_due || self.save_due
    }

    pub(super) fn evaluated(&mut self) {
        self.eval_due = false;
    }

    pub(super) fn saved(&mut self) {
        self.save_due = false;
    }
}

/// Counts a crossing of a multiple of `every` between two consecutive global steps.
fn crossed(every: u64, before: u64, now: u64) -> bool {
    now / every != before / every
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_fall_due_at_the_first_step_past_each_multiple() {
        let mut s = Schedule::fresh(Some(100), 250);
        assert!(s.eval_due() && !s.save_due(), "a fresh run evaluates first");
        s.evaluated();
        s.advance(98);
        assert!(!s.any_due());
        s.advance(102);
        assert!(s.eval_due() && !s.save_due());
        s.evaluated();
        s.advance(260);
        assert!(s.eval_due() && s.save_due(), "260 crossed 200 and 250");
        let resumed = Schedule::resumed(Some(100), 250, 260, (false, false));
        assert!(!resumed.any_due());
        let stopped_before_evaluating = Schedule::resumed(Some(100), 250, 260, (true, false));
        assert!(stopped_before_evaluating.eval_due() && !stopped_before_evaluating.save_due());
        // Stopped during the evaluation before a periodic checkpoint: both are owed, so the
        // checkpoint (and the streams derived there) follows the evaluation, as it would have.
        let stopped_before_saving = Schedule::resumed(Some(100), 250, 260, (true, true));
        assert!(stopped_before_saving.eval_due() && stopped_before_saving.save_due());
        let mut no_evaluations = Schedule::fresh(None, 250);
        assert!(!no_evaluations.any_due(), "nothing waits for evaluations");
        no_evaluations.advance(300);
        assert!(no_evaluations.save_due() && !no_evaluations.eval_due());
    }

    #[test]
    fn a_resume_at_step_zero_does_not_evaluate_again() {
        // Stopped after the first evaluation, before any step: the checkpoint owes none.
        assert!(!Schedule::resumed(Some(100), 250, 0, (false, false)).eval_due());
        assert!(Schedule::resumed(Some(100), 250, 0, (true, false)).eval_due());
    }

    #[test]
    fn a_resume_that_rounds_its_step_down_crosses_no_point_twice() {
        // Saved and evaluated at 1000 by two ranks, resumed by three: 999, then 1002.
        let mut s = Schedule::resumed(Some(500), 1000, 1000, (false, false));
        s.advance(999);
        s.advance(1002);
        assert!(!s.any_due());
        s.advance(1500);
        assert!(s.eval_due() && !s.save_due());
    }
}

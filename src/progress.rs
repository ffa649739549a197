//! Where a run stands between optimizer steps: the one record of resume bookkeeping. The
//! training loop reads it to start an epoch (possibly in the middle) and updates it when an
//! epoch ends or stops; checkpoints only serialise it (`state.json`).

use serde::{Deserialize, Serialize};

/// Completed epochs, and inside an interrupted epoch, what its done steps left behind.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Completed epochs; also the 0-based index of the epoch in progress.
    pub epoch: usize,
    /// Steps already done in epoch `epoch` when the run stopped inside it; 0 at epoch boundaries.
    pub step_in_epoch: usize,
    /// Optimizer steps since the start of the run.
    pub global_step: usize,
    /// Sum of the batch losses of the interrupted epoch's done steps.
    pub partial_loss_sum: f64,
    /// Training seconds of the interrupted epoch's done steps.
    pub partial_seconds: f64,
}

impl Progress {
    /// The start of epoch `epoch` (0-based) of a run with `steps_per_epoch` steps per epoch.
    pub fn at_epoch(epoch: usize, steps_per_epoch: usize) -> Self {
        Self {
            epoch,
            global_step: epoch * steps_per_epoch,
            ..Self::default()
        }
    }

    /// A run that has not taken a step.
    pub fn is_start(&self) -> bool {
        self.epoch == 0 && self.global_step == 0
    }

    /// The run's optimizer-step index of step `step` (0-based, `>= step_in_epoch`) of the
    /// current epoch: what seeds that step's dropout masks.
    pub fn global_step_at(&self, step: usize) -> usize {
        assert!(
            step >= self.step_in_epoch,
            "step {step} is before the resumed step {}",
            self.step_in_epoch
        );
        self.global_step + (step - self.step_in_epoch)
    }

    /// The run's optimizer-step index of the current epoch's first step.
    pub fn epoch_start_step(&self) -> usize {
        self.global_step - self.step_in_epoch
    }

    /// The current epoch stopped after `steps_done` of its steps, with these totals so far.
    pub fn stop_inside(&mut self, steps_done: usize, loss_sum: f64, seconds: f64) {
        self.global_step = self.global_step_at(steps_done);
        self.step_in_epoch = steps_done;
        self.partial_loss_sum = loss_sum;
        self.partial_seconds = seconds;
    }

    /// The current epoch finished, `steps` steps in all.
    pub fn finish_epoch(&mut self, steps: usize) {
        self.global_step = self.global_step_at(steps);
        *self = Self {
            epoch: self.epoch + 1,
            global_step: self.global_step,
            ..Self::default()
        };
    }

    /// "epoch 3" at a boundary, "epoch 4, step 120" (1-based epoch) inside one.
    pub fn describe(&self) -> String {
        if self.step_in_epoch == 0 {
            format!("epoch {}", self.epoch)
        } else {
            format!("epoch {}, step {}", self.epoch + 1, self.step_in_epoch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupted_epoch_resumes_where_an_uninterrupted_one_would_be() {
        let steps = 938;
        let mut straight = Progress::at_epoch(2, steps);
        straight.finish_epoch(steps);

        let mut stopped = Progress::at_epoch(2, steps);
        stopped.stop_inside(100, 25.0, 3.5);
        assert_eq!(
            (stopped.epoch, stopped.step_in_epoch, stopped.global_step),
            (2, 100, 2 * steps + 100)
        );
        assert_eq!(stopped.describe(), "epoch 3, step 100");
        // Step 100 of the epoch is the first one the resumed run takes.
        assert_eq!(stopped.global_step_at(100), 2 * steps + 100);
        stopped.stop_inside(400, 90.0, 12.0);
        assert_eq!(stopped.global_step, 2 * steps + 400);
        stopped.finish_epoch(steps);
        assert_eq!(stopped, straight);
        assert_eq!(straight.describe(), "epoch 3");
        assert_eq!((straight.partial_loss_sum, straight.partial_seconds), (0.0, 0.0));
    }

    #[test]
    fn only_a_new_run_is_at_the_start() {
        assert!(Progress::default().is_start());
        assert!(Progress::at_epoch(0, 10).is_start());
        assert!(!Progress::at_epoch(1, 10).is_start());
        let mut p = Progress::default();
        p.stop_inside(1, 2.3, 0.1);
        assert!(!p.is_start());
    }

    #[test]
    #[should_panic(expected = "before the resumed step")]
    fn a_step_before_the_resume_point_is_a_bug() {
        let mut p = Progress::default();
        p.stop_inside(5, 1.0, 1.0);
        p.global_step_at(4);
    }

    #[test]
    fn serialises_with_the_field_names_of_state_json() {
        let json = serde_json::to_value(Progress::at_epoch(1, 7)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"epoch": 1, "step_in_epoch": 0, "global_step": 7,
                               "partial_loss_sum": 0.0, "partial_seconds": 0.0})
        );
    }
}

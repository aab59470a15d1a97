//! What `tdmpc2 eval` prints: each task's return and success, a multitask run's normalised
//! score, and the whole as one JSON line for scripts.
use crate::trainer::evaluate::{EvalSummary, Evaluation};

/// `eval`'s result: each task's returns, the whole's, and the whole as one JSON line.
/// `run_task` is the run's `task` setting (one task, or a list of them).
pub fn print(run_task: &str, checkpoint: &str, tasks: &[String], evaluation: &Evaluation) {
    let success = |s: &EvalSummary| {
        s.success
            .map_or(String::new(), |rate| format!(", success {rate:.2}"))
    };
    let summary = &evaluation.overall;
    for (task, s) in tasks.iter().zip(&evaluation.by_task) {
        outln!(
            "  {task}: {} episodes, return {:.2} ± {:.2}{}",
            s.episodes,
            s.mean,
            s.std,
            success(s)
        );
    }
    let values = evaluation.values_by_task(tasks);
    if let Some((_, score)) = values.iter().find(|(k, _)| k == "episode_score+normalized") {
        outln!("  normalized score: {score:.1}");
    }
    outln!(
        "{}: {} episodes, return {:.2} ± {:.2} (min {:.2}, max {:.2}){}",
        run_task,
        summary.episodes,
        summary.mean,
        summary.std,
        summary.min,
        summary.max,
        success(summary)
    );
    outln!(
        "{}",
        evaluation_line(run_task, checkpoint, tasks, evaluation)
    );
}

/// `eval`'s last line, for scripts: the summary, its success rate where the task has one and,
/// for several tasks, each one's return and the training log's keys (each task's success, the
/// family averages, the normalised score).
fn evaluation_line(
    task: &str,
    checkpoint: &str,
    tasks: &[String],
    evaluation: &Evaluation,
) -> serde_json::Value {
    let summary = &evaluation.overall;
    let mut line = serde_json::json!({
        "task": task, "checkpoint": checkpoint, "episodes": summary.episodes,
        "mean": summary.mean, "std": summary.std, "min": summary.min, "max": summary.max,
    });
    if let Some(rate) = summary.success {
        line["success"] = rate.into();
    }
    if !evaluation.by_task.is_empty() {
        let by_task: serde_json::Map<String, serde_json::Value> = tasks
            .iter()
            .zip(&evaluation.by_task)
            .map(|(task, s)| (task.clone(), s.mean.into()))
            .collect();
        line["by_task"] = by_task.into();
        let values: serde_json::Map<String, serde_json::Value> = evaluation
            .values_by_task(tasks)
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect();
        line["values"] = values.into();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `eval` says what training logs: success rates where a task has them and, for several
    /// tasks, the normalised score of the TD-MPC2 paper.
    #[test]
    fn an_evaluation_line_holds_success_and_the_normalized_score() {
        let summary = |mean: f64, success: Option<f64>| EvalSummary {
            episodes: 2,
            mean,
            std: 0.0,
            min: mean,
            max: mean,
            mean_length: 500.0,
            success,
        };
        let one = Evaluation {
            overall: summary(150.0, Some(0.5)),
            by_task: Vec::new(),
        };
        let line = evaluation_line("mw-reach", "ckpt", &["mw-reach".into()], &one);
        assert_eq!(line["success"], 0.5);
        assert!(
            line.get("values").is_none() && line.get("by_task").is_none(),
            "{line}"
        );
        let tasks = ["walker-run".to_string(), "mw-reach".to_string()];
        let two = Evaluation {
            overall: summary(400.0, Some(0.5)),
            by_task: vec![summary(700.0, None), summary(100.0, Some(0.5))],
        };
        let line = evaluation_line("[walker-run,mw-reach]", "ckpt", &tasks, &two);
        assert_eq!(line["by_task"]["walker-run"], 700.0);
        assert_eq!(line["values"]["episode_success+mw-reach"], 0.5);
        // (700 / 10 + 0.5 × 100) / 2
        assert_eq!(line["values"]["episode_score+normalized"], 60.0);
    }
}

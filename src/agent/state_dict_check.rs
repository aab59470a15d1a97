//! Whether a state dict's shapes agree among themselves, whatever settings built it: every layer
//! whole, each layer taking what the one before gives, the heads reading the same latent. A file
//! that fails is incomplete or damaged; one that passes and still does not load was trained
//! with other settings.
use std::collections::BTreeMap;

use super::world_model::{DYNAMICS, POLICY, Q_ONLINE, Q_TARGET, REWARD, TERMINATION};

/// The layered stacks whose layers are numbered 0, 1, 2, ... with nothing between them.
const MLP_STACKS: [&str; 7] = [
    "_encoder.state",
    DYNAMICS,
    REWARD,
    POLICY,
    TERMINATION,
    Q_ONLINE,
    Q_TARGET,
];

/// The parameters of one numbered layer, by their last name part (`weight`, `bias`,
/// `ln.weight`, `ln.bias`).
type Layer<'a> = BTreeMap<&'a str, &'a [i64]>;

/// What is wrong with the shapes of `named` (name, shape), or `None` when they agree.
pub fn inconsistency(named: &[(String, Vec<i64>)]) -> Option<String> {
    let mut stacks: BTreeMap<&str, BTreeMap<usize, Layer>> = BTreeMap::new();
    for (name, shape) in named {
        if let Some((stack, index, part)) = layer_parameter(name) {
            let layers = stacks.entry(stack).or_default();
            layers.entry(index).or_default().insert(part, shape);
        }
    }
    for (stack, layers) in &stacks {
        for (index, layer) in layers {
            if let Some(why) = layer_inconsistency(&format!("{stack}.{index}"), layer) {
                return Some(why);
            }
        }
        if MLP_STACKS.contains(stack) {
            if let Some(why) = chain_inconsistency(stack, layers) {
                return Some(why);
            }
        }
    }
    targets_inconsistency(named).or_else(|| heads_inconsistency(&stacks, named))
}

/// `_reward.1.ln.weight` → (`_reward`, 1, `ln.weight`).
fn layer_parameter(name: &str) -> Option<(&str, usize, &str)> {
    for part in ["ln.weight", "ln.bias", "weight", "bias"] {
        let Some(head) = name.strip_suffix(part).and_then(|h| h.strip_suffix('.')) else {
            continue;
        };
        let (stack, index) = head.rsplit_once('.')?;
        return Some((stack, index.parse().ok()?, part));
    }
    None
}

/// A layer's weight comes with its bias (its shape less the inputs, or the filters of a
/// convolution), and a LayerNorm's scale with its shift, both the bias's shape.
fn layer_inconsistency(layer_name: &str, layer: &Layer) -> Option<String> {
    let pairs = [
        ("weight", "bias"),
        ("bias", "weight"),
        ("ln.weight", "ln.bias"),
        ("ln.bias", "ln.weight"),
    ];
    for (one, other) in pairs {
        if layer.contains_key(one) && !layer.contains_key(other) {
            return Some(format!(
                "`{layer_name}.{other}` is missing beside `{layer_name}.{one}`"
            ));
        }
    }
    let (Some(weight), Some(bias)) = (layer.get("weight"), layer.get("bias")) else {
        return None;
    };
    let expected: Vec<i64> = match weight.len() {
        4 => weight[..1].to_vec(),
        n => weight[..n.saturating_sub(1)].to_vec(),
    };
    if **bias != expected[..] {
        return Some(format!(
            "`{layer_name}.bias` has shape {bias:?} where its weight {weight:?} gives {expected:?}"
        ));
    }
    for part in ["ln.weight", "ln.bias"] {
        match layer.get(part) {
            Some(shape) if **shape != expected[..] => {
                return Some(format!(
                    "`{layer_name}.{part}` has shape {shape:?} where its layer gives {expected:?}"
                ))
            }
            _ => {}
        }
    }
    None
}

/// A stack's layers are 0..n, and each linear layer takes the outputs of the one before.
fn chain_inconsistency(stack: &str, layers: &BTreeMap<usize, Layer>) -> Option<String> {
    if let Some((position, index)) = layers.keys().enumerate().find(|(i, index)| i != *index) {
        return Some(format!(
            "`{stack}` has a layer {index} but no layer {position}"
        ));
    }
    let weights: Vec<&[i64]> = layers
        .values()
        .filter_map(|l| l.get("weight").copied())
        .collect();
    for (i, pair) in weights.windows(2).enumerate() {
        let (before, after) = (pair[0], pair[1]);
        let (Some(gives), Some(takes)) = (outputs(before), inputs(after)) else {
            continue;
        };
        if gives != takes {
            return Some(format!(
                "`{stack}.{}.weight` takes {takes} inputs, but `{stack}.{i}.weight` gives {gives}",
                i + 1
            ));
        }
    }
    None
}

/// A linear weight's (or a Q ensemble's stacked weights') outputs.
fn outputs(weight: &[i64]) -> Option<i64> {
    matches!(weight.len(), 2 | 3).then(|| weight[weight.len() - 2])
}

fn inputs(weight: &[i64]) -> Option<i64> {
    matches!(weight.len(), 2 | 3).then(|| weight[weight.len() - 1])
}

/// The target Qs are a copy of the Qs: the same parameters, the same shapes.
fn targets_inconsistency(named: &[(String, Vec<i64>)]) -> Option<String> {
    let under = |prefix: &str| -> BTreeMap<String, Vec<i64>> {
        named
            .iter()
            .filter_map(|(name, shape)| {
                let rest = name.strip_prefix(prefix)?.strip_prefix('.')?;
                Some((rest.to_string(), shape.clone()))
            })
            .collect()
    };
    let (online, target) = (under(Q_ONLINE), under(Q_TARGET));
    if online.is_empty() || target.is_empty() {
        return None;
    }
    for (rest, shape) in &online {
        match target.get(rest) {
            None => {
                return Some(format!(
                    "`{Q_TARGET}.{rest}` is missing beside `{Q_ONLINE}.{rest}`"
                ))
            }
            Some(other) if other != shape => {
                return Some(format!(
                "`{Q_TARGET}.{rest}` has shape {other:?} where `{Q_ONLINE}.{rest}` has {shape:?}"
            ))
            }
            _ => {}
        }
    }
    let extra = target.keys().find(|rest| !online.contains_key(*rest))?;
    Some(format!(
        "`{Q_ONLINE}.{extra}` is missing beside `{Q_TARGET}.{extra}`"
    ))
}

/// The dynamics, reward and Q heads all read a latent state with an action (and the task's
/// embedding); the policy and the termination head a latent state (with the embedding); the
/// dynamics and the state encoder give a latent state.
fn heads_inconsistency(
    stacks: &BTreeMap<&str, BTreeMap<usize, Layer>>,
    named: &[(String, Vec<i64>)],
) -> Option<String> {
    let weight = |stack: &str, which: Which| -> Option<(String, &[i64])> {
        let layers = stacks.get(stack)?;
        let (index, layer) = match which {
            Which::First => layers.iter().next()?,
            Which::Last => layers.iter().next_back()?,
        };
        Some((format!("{stack}.{index}.weight"), layer.get("weight")?))
    };
    let first_inputs = |stack| weight(stack, Which::First).and_then(|(n, w)| Some((n, inputs(w)?)));
    let last_outputs = |stack| weight(stack, Which::Last).and_then(|(n, w)| Some((n, outputs(w)?)));
    let same = |pairs: Vec<Option<(String, i64)>>, what: &str| -> Option<String> {
        let known: Vec<(String, i64)> = pairs.into_iter().flatten().collect();
        let (first, size) = known.first()?;
        let (other, other_size) = known.iter().find(|(_, s)| s != size)?;
        Some(format!(
            "`{first}` has {size} {what} but `{other}` has {other_size}: they read or give the \
             same latent state"
        ))
    };
    let with_action = vec![
        first_inputs(DYNAMICS),
        first_inputs(REWARD),
        first_inputs(Q_ONLINE),
    ];
    let latent_in = vec![first_inputs(POLICY), first_inputs(TERMINATION)];
    let latent_out = vec![last_outputs(DYNAMICS), last_outputs("_encoder.state")];
    let found = same(with_action, "inputs")
        .or_else(|| same(latent_in, "inputs"))
        .or_else(|| same(latent_out, "outputs"));
    if found.is_some() {
        return found;
    }
    // The policy reads the latent state and the task's embedding, if any.
    let task_dim = named
        .iter()
        .find(|(name, _)| name == "_task_emb.weight")
        .and_then(|(_, shape)| shape.get(1).copied())
        .unwrap_or(0);
    let ((policy, reads), (dynamics, latent)) = (first_inputs(POLICY)?, last_outputs(DYNAMICS)?);
    (reads != latent + task_dim).then(|| {
        format!(
            "`{policy}` takes {reads} inputs, but `{dynamics}` gives a latent state of {latent}{}",
            match task_dim {
                0 => String::new(),
                d => format!(" (and the task embedding {d})"),
            }
        )
    })
}

#[derive(Clone, Copy)]
enum Which {
    First,
    Last,
}

#[cfg(test)]
mod tests {
    use super::*;

    type Named = Vec<(String, Vec<i64>)>;
    /// What a case expects in the message, and how it spoils a whole model.
    type Case = (&'static str, fn(&mut Named));

    /// A small state model's shapes (latent 8, action 2, observation 3, 2 Qs, 5 bins).
    fn shapes() -> Named {
        let mut named = Vec::new();
        let mut linear = |stack: &str, index: usize, out: i64, inp: i64, ln: bool, q: bool| {
            let lead: Vec<i64> = if q { vec![2] } else { vec![] };
            let with = |dims: &[i64]| [lead.clone(), dims.to_vec()].concat();
            named.push((format!("{stack}.{index}.weight"), with(&[out, inp])));
            named.push((format!("{stack}.{index}.bias"), with(&[out])));
            if ln {
                named.push((format!("{stack}.{index}.ln.weight"), with(&[out])));
                named.push((format!("{stack}.{index}.ln.bias"), with(&[out])));
            }
        };
        linear("_encoder.state", 0, 16, 3, true, false);
        linear("_encoder.state", 1, 8, 16, true, false);
        for (stack, out, ln_last) in [(DYNAMICS, 8, true), (REWARD, 5, false)] {
            linear(stack, 0, 32, 10, true, false);
            linear(stack, 1, 32, 32, true, false);
            linear(stack, 2, out, 32, ln_last, false);
        }
        linear(POLICY, 0, 32, 8, true, false);
        linear(POLICY, 1, 32, 32, true, false);
        linear(POLICY, 2, 4, 32, false, false);
        for stack in [Q_ONLINE, Q_TARGET] {
            linear(stack, 0, 32, 10, true, true);
            linear(stack, 1, 32, 32, true, true);
            linear(stack, 2, 5, 32, false, true);
        }
        named.push(("log_std_min".into(), vec![]));
        named
    }

    fn with(change: impl FnOnce(&mut Named)) -> Option<String> {
        let mut named = shapes();
        change(&mut named);
        inconsistency(&named)
    }

    fn set(named: &mut [(String, Vec<i64>)], name: &str, shape: &[i64]) {
        let entry = named.iter_mut().find(|(n, _)| n == name).unwrap();
        entry.1 = shape.to_vec();
    }

    fn remove(named: &mut Named, name: &str) {
        named.retain(|(n, _)| n != name);
    }

    #[test]
    fn a_whole_model_agrees_with_itself() {
        assert_eq!(inconsistency(&shapes()), None);
        // A multitask model's heads read the task embedding too.
        let multitask = with(|named| {
            named.push(("_task_emb.weight".into(), vec![3, 4]));
            set(named, "_pi.0.weight", &[32, 12]);
        });
        assert_eq!(multitask, None);
    }

    /// The official models recorded for the parity tests (state, pixels, multitask, episodic,
    /// Q dropout) pass, so no real model is refused.
    #[test]
    fn the_recorded_official_models_agree_with_themselves() {
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let mut checked = 0;
        for entry in std::fs::read_dir(&data).unwrap() {
            let weights = entry.unwrap().path().join("weights.safetensors");
            if !weights.is_file() {
                continue;
            }
            let tensors = tch::Tensor::read_safetensors(&weights).unwrap();
            let named: Named = tensors.iter().map(|(n, t)| (n.clone(), t.size())).collect();
            assert_eq!(inconsistency(&named), None, "{}", weights.display());
            checked += 1;
        }
        assert!(checked >= 6, "found {checked} recorded models");
    }

    #[test]
    fn a_missing_or_misshapen_part_is_named() {
        let cases: [Case; 9] = [
            (
                "`_dynamics.0.bias` is missing beside `_dynamics.0.weight`",
                |n| remove(n, "_dynamics.0.bias"),
            ),
            (
                "`_reward.1.ln.bias` is missing beside `_reward.1.ln.weight`",
                |n| remove(n, "_reward.1.ln.bias"),
            ),
            ("`_pi` has a layer 2 but no layer 1", |n| {
                n.retain(|(name, _)| !name.starts_with("_pi.1."))
            }),
            (
                "`_reward.1.weight` takes 10 inputs, but `_reward.0.weight` gives 32",
                |n| set(n, "_reward.1.weight", &[32, 10]),
            ),
            ("`_reward.1.bias` has shape [31] where its weight", |n| {
                set(n, "_reward.1.bias", &[31])
            }),
            (
                "`_target_Qs_params.2.bias` has shape [2, 6] where `_Qs.params.2.bias` has [2, 5]",
                |n| {
                    set(n, "_target_Qs_params.2.weight", &[2, 6, 32]);
                    set(n, "_target_Qs_params.2.bias", &[2, 6]);
                },
            ),
            (
                "`_target_Qs_params.2.bias` is missing beside `_Qs.params.2.bias`",
                |n| n.retain(|(name, _)| !name.starts_with("_target_Qs_params.2.")),
            ),
            (
                "`_dynamics.0.weight` has 10 inputs but `_reward.0.weight` has 11",
                |n| set(n, "_reward.0.weight", &[32, 11]),
            ),
            (
                "`_pi.0.weight` takes 9 inputs, but `_dynamics.2.weight` gives a latent state of 8",
                |n| set(n, "_pi.0.weight", &[32, 9]),
            ),
        ];
        for (expected, change) in cases {
            let found = with(change).unwrap_or_default();
            assert!(found.contains(expected), "{expected:?} not in {found:?}");
        }
    }
}

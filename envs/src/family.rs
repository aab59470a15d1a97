//! Which simulator a task comes from, and which Python environment its simulator lives in.
//!
//! Simulators pin MuJoCo versions that cannot share one venv (dm_control 1.0.50 needs
//! mujoco ≥ 3.17, metaworld 3.1.1 pins 3.3.0, myosuite 3.0 brings 4.0 and gymnasium < 1.3).
//! The project's venv holds dm_control and gymnasium; Meta-World and MyoSuite each have a venv
//! of their own (`scripts/setup.sh --family NAME` makes it), and their environments always
//! step in worker processes whose embedded interpreter uses that venv: this process never
//! imports their packages.
use std::path::PathBuf;

use crate::{dmc, gym, metaworld, myosuite, native, Error, Result};

/// The variable a parent sets on a worker process that serves one family's environments
/// with that family's venv (its value: the family's name).
pub const HOSTED_FAMILY_VAR: &str = "TDMPC2_ENV_FAMILY";

/// The official ManiSkill2 tasks, which need SAPIEN 2.2.
pub const MANISKILL2_TASKS: [&str; 5] = [
    "lift-cube",
    "pick-cube",
    "stack-cube",
    "pick-ycb",
    "turn-faucet",
];

/// Where a task comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Implemented in Rust (`Pendulum-v1`, `MountainCarContinuous-v0`).
    Native,
    /// dm_control's suite and the official custom tasks.
    DmControl,
    /// Any gymnasium id, and the four gymnasium tasks the official code names itself.
    Gymnasium,
    MetaWorld,
    MyoSuite,
    /// Refused: SAPIEN 2.2 has no build for this Python.
    ManiSkill2,
}

impl Family {
    /// The families whose simulators need a venv of their own.
    pub const WITH_OWN_VENV: [Family; 2] = [Family::MetaWorld, Family::MyoSuite];

    /// The family of a task the registry knows by name; None for gymnasium ids (they are only
    /// known by asking gymnasium) and unknown names.
    pub fn of(task: &str) -> Option<Family> {
        if native::TASKS.contains(&task) {
            Some(Family::Native)
        } else if dmc::is_task(task) {
            Some(Family::DmControl)
        } else if metaworld::is_task(task) {
            Some(Family::MetaWorld)
        } else if myosuite::is_task(task) {
            Some(Family::MyoSuite)
        } else if gym::official(task).is_some() {
            Some(Family::Gymnasium)
        } else if MANISKILL2_TASKS.contains(&task) {
            Some(Family::ManiSkill2)
        } else {
            None
        }
    }

    /// The name `scripts/setup.sh --family` and `TDMPC2_VENV_<NAME>` use.
    pub fn name(self) -> &'static str {
        match self {
            Family::Native => "native",
            Family::DmControl => "dmcontrol",
            Family::Gymnasium => "gymnasium",
            Family::MetaWorld => "metaworld",
            Family::MyoSuite => "myosuite",
            Family::ManiSkill2 => "maniskill2",
        }
    }

    /// The name its project goes by.
    pub fn title(self) -> &'static str {
        match self {
            Family::Native => "native",
            Family::DmControl => "DMControl",
            Family::Gymnasium => "gymnasium",
            Family::MetaWorld => "Meta-World",
            Family::MyoSuite => "MyoSuite",
            Family::ManiSkill2 => "ManiSkill2",
        }
    }

    /// Simulator steps an agent step takes (the official wrappers'): the official results
    /// count steps in these.
    pub fn action_repeat(self) -> usize {
        match self {
            Family::DmControl => dmc::ACTION_REPEAT,
            Family::MetaWorld => metaworld::ACTION_REPEAT,
            Family::ManiSkill2 => 2,
            Family::Native | Family::Gymnasium | Family::MyoSuite => 1,
        }
    }

    /// Whether its simulator lives in a venv of its own.
    pub fn has_own_venv(self) -> bool {
        Self::WITH_OWN_VENV.contains(&self)
    }

    /// The family whose venv this process's interpreter uses, when it is a worker serving one.
    pub fn hosted() -> Option<Family> {
        let name = std::env::var(HOSTED_FAMILY_VAR).ok()?;
        Self::WITH_OWN_VENV.into_iter().find(|f| f.name() == name)
    }

    /// Whether this process can make the family's environments itself: its simulator is in the
    /// project's venv, or this is a worker serving the family with its venv.
    pub fn steps_here(self) -> bool {
        match Self::hosted() {
            Some(hosted) => hosted == self,
            None => !self.has_own_venv(),
        }
    }

    /// The variable that points at the family's venv instead of the default one.
    pub fn venv_var(self) -> String {
        format!("TDMPC2_VENV_{}", self.name().to_uppercase())
    }

    /// The family's venv: `TDMPC2_VENV_<NAME>`, else beside the project's venv
    /// (`.venv-metaworld` beside `.venv`).
    pub fn venv(self) -> PathBuf {
        if let Some(dir) = self.venv_from_variable() {
            return dir;
        }
        let main = embedded_python::venv_dir();
        let mut name = main.file_name().unwrap_or_default().to_os_string();
        name.push(format!("-{}", self.name()));
        main.with_file_name(name)
    }

    /// `TDMPC2_VENV_<NAME>`, when set to something (empty is unset).
    fn venv_from_variable(self) -> Option<PathBuf> {
        std::env::var_os(self.venv_var())
            .filter(|dir| !dir.is_empty())
            .map(PathBuf::from)
    }

    /// The package a venv of the family's own holds (what its adapter imports).
    fn package(self) -> Option<&'static str> {
        match self {
            Family::MetaWorld => Some("metaworld"),
            Family::MyoSuite => Some("myosuite"),
            _ => None,
        }
    }

    /// What installs the family's venv.
    pub fn install_command(self) -> String {
        format!("scripts/setup.sh --family {}", self.name())
    }

    /// The site-packages of the family's venv, made for this interpreter's Python version;
    /// an error naming the command that installs it when there is none.
    pub fn site_packages(self) -> Result<PathBuf> {
        self.site_packages_of(&self.venv())
    }

    /// [`Self::site_packages`] of the venv at `venv`.
    fn site_packages_of(self, venv: &std::path::Path) -> Result<PathBuf> {
        let inside = embedded_python::site_packages_in_venv();
        let site = venv.join(&inside);
        let lacks = |package: &str| !holds_package(&site, package);
        let problem = match (venv.join("pyvenv.cfg").is_file(), site.is_dir()) {
            (true, true) => match self.package().filter(|p| lacks(p)) {
                None => return Ok(site),
                Some(package) => format!(
                    "the one at {}{} has no {package} (another family's venv, or an install \
                     that failed)",
                    venv.display(),
                    match self.venv_from_variable() {
                        Some(_) => format!(" ({})", self.venv_var()),
                        None => String::new(),
                    }
                ),
            },
            (true, false) => format!(
                "the one at {} was made for another Python than this binary's (it has no {}; \
                 remove it)",
                venv.display(),
                inside.display()
            ),
            (false, _) => format!("there is none at {}", venv.display()),
        };
        Err(Error::FamilyMissing {
            family: self.title(),
            problem,
            install: self.install_command(),
            venv_var: self.venv_var(),
        })
    }

    /// Whether its tasks observe state only, as in the official code (their videos still
    /// render).
    pub fn observes_state_only(self) -> bool {
        matches!(self, Family::MetaWorld | Family::MyoSuite)
    }

    /// Why a task of this family cannot be made at all (ManiSkill2), if so.
    pub fn refusal(self) -> Option<&'static str> {
        (self == Family::ManiSkill2).then_some(
            "ManiSkill2 needs SAPIEN 2.2, which has no build for this Python (the official \
             ManiSkill2 tasks run on Python 3.8-3.10 with sapien==2.2.*); train a DMControl, \
             Meta-World, MyoSuite or gymnasium task instead",
        )
    }
}

/// Whether `site` (a site-packages folder) holds `package`: its folder, or what pip leaves
/// beside any install of it, editable ones too (`<package>-<version>.dist-info`, an egg link).
fn holds_package(site: &std::path::Path, package: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(site) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name().to_string_lossy().to_lowercase();
        name == package
            || name == format!("{package}.egg-link")
            || name.starts_with(&format!("{package}-"))
            || name.starts_with(&format!("__editable__.{package}-"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_map_to_their_families() {
        assert_eq!(Family::of("walker-run"), Some(Family::DmControl));
        assert_eq!(Family::of("Pendulum-v1"), Some(Family::Native));
        assert_eq!(Family::of("mw-reach"), Some(Family::MetaWorld));
        assert_eq!(Family::of("myo-pen-twirl-hard"), Some(Family::MyoSuite));
        assert_eq!(Family::of("mujoco-walker"), Some(Family::Gymnasium));
        assert_eq!(Family::of("lift-cube"), Some(Family::ManiSkill2));
        assert_eq!(Family::of("mw-nothing"), None);
        assert!(Family::MetaWorld.has_own_venv() && !Family::DmControl.has_own_venv());
    }

    #[test]
    fn a_family_venv_sits_beside_the_projects_unless_a_variable_says_otherwise() {
        let venv = Family::MyoSuite.venv();
        let main = embedded_python::venv_dir();
        assert_eq!(venv.parent(), main.parent());
        assert!(venv.to_string_lossy().ends_with("-myosuite"), "{venv:?}");
        assert_eq!(Family::MetaWorld.venv_var(), "TDMPC2_VENV_METAWORLD");
        assert_eq!(
            Family::MetaWorld.install_command(),
            "scripts/setup.sh --family metaworld"
        );
    }

    /// An install pip made of the package, editable or not, counts; another package's does not.
    #[test]
    fn a_package_is_found_however_pip_installed_it() {
        let site = std::env::temp_dir().join(format!("tdmpc2-site-{}", std::process::id()));
        let holds = |entries: &[&str]| {
            let _ = std::fs::remove_dir_all(&site);
            std::fs::create_dir_all(&site).unwrap();
            for entry in entries {
                std::fs::write(site.join(entry), "").unwrap();
            }
            holds_package(&site, "metaworld")
        };
        assert!(holds(&["metaworld-3.1.1.dist-info"]));
        assert!(holds(&["__editable__.metaworld-3.1.1.pth"]));
        assert!(!holds(&[
            "myosuite-2.0.dist-info",
            "metaworlds-1.0.dist-info"
        ]));
        std::fs::remove_dir_all(&site).unwrap();
    }

    /// A venv that is there but lacks the family's package (another family's) is named, with
    /// what to run; not left to the worker's import to fail.
    #[test]
    fn a_venv_without_the_familys_package_is_named() {
        let main = embedded_python::venv_dir();
        if !main.join("pyvenv.cfg").is_file() {
            return;
        }
        let site = embedded_python::site_packages_in_venv();
        assert!(
            main.join(&site).is_dir() && !main.join(&site).join("metaworld").exists(),
            "the project's venv holds no metaworld"
        );
        let err = Family::MetaWorld
            .site_packages_of(&main)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("the one at {} has no metaworld", main.display()))
                && err.contains("scripts/setup.sh --family metaworld"),
            "{err}"
        );
    }
}

"""The custom DMControl tasks of TD-MPC2's mt30 task set, built on dm_control's suite.

Walker, cheetah and hopper variants with new rewards, a three-link reacher, cup spin and
pendulum spin, matching the official TD-MPC2 definitions: same models, rewards,
observations, time limits and initial states. This module is embedded in the binary and
loaded from a string, so it reads no files of its own: the models are dm_control's XML,
edited here where the official ones differ.
"""
import xml.etree.ElementTree as ET

import numpy as np
from dm_control.rl import control
from dm_control.suite import ball_in_cup, base, cheetah, common, hopper, pendulum, reacher, walker
from dm_control.utils import rewards

_INF = float("inf")


def _edit_model(xml, edit):
    """dm_control's model XML, changed in place by `edit(root)`."""
    root = ET.fromstring(xml)
    edit(root)
    return ET.tostring(root, encoding="unicode")


def _lengthen_plane(name, half_length):
    """An edit that sets the half-length (first size) of the plane geom `name`. The official
    walker and cheetah models have floors twice as long as dm_control's (only what is drawn
    changes: planes collide as infinite)."""

    def edit(root):
        plane = root.find(f".//geom[@name='{name}']")
        size = plane.get("size").split()
        plane.set("size", " ".join([half_length] + size[1:]))

    return edit


# Walker.


class _WalkerBackwards(walker.PlanarWalker):
    """Stand up and move in -x at `move_speed` or faster."""

    def get_reward(self, physics):
        standing = rewards.tolerance(
            physics.torso_height(),
            bounds=(walker._STAND_HEIGHT, _INF),
            margin=walker._STAND_HEIGHT / 2,
        )
        upright = (1 + physics.torso_upright()) / 2
        stand_reward = (3 * standing + upright) / 4
        move_reward = rewards.tolerance(
            physics.horizontal_velocity(),
            bounds=(-_INF, -self._move_speed),
            margin=self._move_speed / 2,
            value_at_margin=0.5,
            sigmoid="linear",
        )
        return stand_reward * (5 * move_reward + 1) / 6


def _walker(move_speed, random):
    xml = _edit_model(walker.get_model_and_assets()[0], _lengthen_plane("floor", "500"))
    physics = walker.Physics.from_xml_string(xml, common.ASSETS)
    return control.Environment(
        physics,
        _WalkerBackwards(move_speed, random=random),
        time_limit=walker._DEFAULT_TIME_LIMIT,
        control_timestep=walker._CONTROL_TIMESTEP,
    )


# Cheetah.

# Height above which a raised body part counts as fully up.
_CHEETAH_UP = 1.2


def _cheetah_up(height):
    return rewards.tolerance(height, bounds=(_CHEETAH_UP, _INF), margin=_CHEETAH_UP / 2)


def _at_least(value, target):
    """1 at `target` or above, falling linearly to 0 at 0."""
    return rewards.tolerance(
        value, bounds=(target, _INF), margin=target, value_at_margin=0, sigmoid="linear"
    )


class _CheetahBackwards(cheetah.Cheetah):
    """Run in -x at `speed` or faster."""

    def __init__(self, speed, random=None):
        super().__init__(random=random)
        self._speed = speed

    def get_reward(self, physics):
        return rewards.tolerance(
            physics.speed(),
            bounds=(-_INF, -self._speed),
            margin=self._speed,
            value_at_margin=0,
            sigmoid="linear",
        )


class _CheetahOneFoot(cheetah.Cheetah):
    """Run forwards at `speed` or faster on one pair of legs, with the torso and the other
    foot, `raised` ('bfoot' or 'ffoot'), held high."""

    def __init__(self, raised, speed, random=None):
        super().__init__(random=random)
        self._raised = raised
        self._speed = speed

    def get_reward(self, physics):
        xpos = physics.named.data.xpos
        torso_up = _cheetah_up(xpos["torso", "z"])
        foot_up = _cheetah_up(xpos[self._raised, "z"])
        up = (3 * foot_up + 2 * torso_up) / 5
        return up * (5 * _at_least(physics.speed(), self._speed) + 1) / 6


class _CheetahJump(cheetah.Cheetah):
    """Rear up on either pair of legs while staying (nearly) in place."""

    # Horizontal speed (either way) below which the cheetah counts as in place.
    _MAX_SPEED = 0.5

    def _stand_on_one_pair(self, physics, raised):
        xpos = physics.named.data.xpos
        high = _cheetah_up((xpos["torso", "z"] + xpos[raised, "z"]) / 2)
        still = rewards.tolerance(
            physics.speed(),
            bounds=(-self._MAX_SPEED, self._MAX_SPEED),
            margin=self._MAX_SPEED,
            value_at_margin=0,
            sigmoid="linear",
        )
        return (5 * high + still) / 6

    def get_reward(self, physics):
        front = self._stand_on_one_pair(physics, "bfoot")
        back = self._stand_on_one_pair(physics, "ffoot")
        return (front + back) / 2


def _cheetah(task):
    xml = _edit_model(cheetah.get_model_and_assets()[0], _lengthen_plane("ground", "200"))
    physics = cheetah.Physics.from_xml_string(xml, common.ASSETS)
    return control.Environment(physics, task, time_limit=cheetah._DEFAULT_TIME_LIMIT)


# Hopper.

_HOPPER_STAND_HEIGHT = 0.6
_HOPPER_HOP_SPEED = 2


class _HopperBackwards(hopper.Hopper):
    """Stand and hop in -x at half the hopping speed or faster."""

    def __init__(self, random=None):
        super().__init__(hopping=None, random=random)

    def get_reward(self, physics):
        standing = rewards.tolerance(physics.height(), (_HOPPER_STAND_HEIGHT, 2))
        hopping = rewards.tolerance(
            physics.speed(),
            bounds=(-_INF, -_HOPPER_HOP_SPEED / 2),
            margin=_HOPPER_HOP_SPEED / 4,
            value_at_margin=0.5,
            sigmoid="linear",
        )
        return standing * hopping


def _hopper_backwards(random):
    physics = hopper.Physics.from_xml_string(*hopper.get_model_and_assets())
    return control.Environment(
        physics, _HopperBackwards(random=random), time_limit=20, control_timestep=0.02
    )


# Reacher with three links.

# Body and geom name, joint name, capsule length, joint range (None: unlimited), from the
# shoulder out. Every body, the finger included, sits 0.09 from its parent.
_REACHER_LINKS = (
    ("arm0", "shoulder0", "0.09", None),
    ("arm1", "shoulder1", "0.09", "-80 80"),
    ("hand", "wrist", "0.1", "-80 80"),
)
_REACHER_SPACING = ".09 0 0"


def _three_links(root):
    """Replaces dm_control's two-link arm, where it stands, with three links and motors."""
    world = root.find("worldbody")
    arm = world.find("body[@name='arm']")
    finger = arm.find(".//body[@name='finger']")
    index = list(world).index(arm)
    world.remove(arm)

    parent = None
    for name, joint, length, limits in _REACHER_LINKS:
        pos = arm.get("pos") if parent is None else _REACHER_SPACING
        body = ET.Element("body", name=name, pos=pos)
        ET.SubElement(
            body, "geom", name=name, type="capsule", fromto=f"0 0 0 {length} 0 0",
            size=".01", material="self",
        )
        if limits is None:
            ET.SubElement(body, "joint", name=joint)
        else:
            ET.SubElement(body, "joint", name=joint, limited="true", range=limits)
        if parent is None:
            world.insert(index, body)
        else:
            parent.append(body)
        parent = body
    finger.set("pos", _REACHER_SPACING)
    parent.append(finger)

    actuators = root.find("actuator")
    for motor in list(actuators):
        actuators.remove(motor)
    for _, joint, _, _ in _REACHER_LINKS:
        ET.SubElement(actuators, "motor", name=joint, joint=joint)


def _reacher_three(target_size, random):
    xml = _edit_model(reacher.get_model_and_assets()[0], _three_links)
    physics = reacher.Physics.from_xml_string(xml, common.ASSETS)
    task = reacher.Reacher(target_size=target_size, random=random)
    return control.Environment(physics, task, time_limit=20)


# Ball in cup.

_CUP_SPIN_DISTANCE = 0.5
_CUP_SPIN_SPEED = 6.0


class _CupSpin(ball_in_cup.BallInCup):
    """Swing the ball around, far from the cup and fast."""

    def initialize_episode(self, physics):
        # The ball starts in the cup, except in one episode in ten where it may start
        # anywhere; never touching anything.
        anywhere = self.random.uniform() < 0.1
        while True:
            physics.named.data.qpos["ball_x"] = self.random.uniform(-0.2, 0.2)
            physics.named.data.qpos["ball_z"] = self.random.uniform(0.2, 0.5)
            physics.after_reset()
            if physics.data.ncon == 0 and (anywhere or physics.in_target()):
                break
        base.Task.initialize_episode(self, physics)

    def get_reward(self, physics):
        distance = np.linalg.norm(physics.ball_to_target())
        qvel = physics.named.data.qvel
        speed = np.linalg.norm([qvel["ball_x"], qvel["ball_z"]])
        far = rewards.tolerance(
            distance,
            bounds=(_CUP_SPIN_DISTANCE, _INF),
            margin=_CUP_SPIN_DISTANCE / 2,
            value_at_margin=0.5,
            sigmoid="linear",
        )
        fast = rewards.tolerance(
            speed,
            bounds=(_CUP_SPIN_SPEED, _INF),
            margin=_CUP_SPIN_SPEED / 2,
            value_at_margin=0.5,
            sigmoid="linear",
        )
        return (1 - physics.in_target()) * (far + 2 * fast) / 3


def _cup_spin(random):
    physics = ball_in_cup.Physics.from_xml_string(*ball_in_cup.get_model_and_assets())
    return control.Environment(
        physics, _CupSpin(random=random), time_limit=20, control_timestep=0.02
    )


# Pendulum.

_PENDULUM_SPIN_SPEED = 9.0


class _PendulumSpin(pendulum.SwingUp):
    """Spin the pole, either way, at `_PENDULUM_SPIN_SPEED` rad/s or faster."""

    def get_reward(self, physics):
        return rewards.tolerance(
            np.linalg.norm(physics.angular_velocity()),
            bounds=(_PENDULUM_SPIN_SPEED, _INF),
            margin=_PENDULUM_SPIN_SPEED / 2,
            value_at_margin=0.5,
            sigmoid="linear",
        )


def _pendulum_spin(random):
    physics = pendulum.Physics.from_xml_string(*pendulum.get_model_and_assets())
    return control.Environment(physics, _PendulumSpin(random=random), time_limit=20)


_TASKS = {
    ("walker", "walk_backwards"): lambda random: _walker(walker._WALK_SPEED, random),
    ("walker", "run_backwards"): lambda random: _walker(walker._RUN_SPEED, random),
    ("cheetah", "run_backwards"): lambda random: _cheetah(
        _CheetahBackwards(cheetah._RUN_SPEED * 0.8, random=random)
    ),
    ("cheetah", "run_front"): lambda random: _cheetah(
        _CheetahOneFoot("bfoot", cheetah._RUN_SPEED * 0.6, random=random)
    ),
    ("cheetah", "run_back"): lambda random: _cheetah(
        _CheetahOneFoot("ffoot", cheetah._RUN_SPEED * 0.6, random=random)
    ),
    ("cheetah", "jump"): lambda random: _cheetah(_CheetahJump(random=random)),
    ("hopper", "hop_backwards"): _hopper_backwards,
    ("reacher", "three_easy"): lambda random: _reacher_three(0.05, random),
    ("reacher", "three_hard"): lambda random: _reacher_three(0.015, random),
    ("ball_in_cup", "spin"): _cup_spin,
    ("pendulum", "spin"): _pendulum_spin,
}


def load(domain, task, seed):
    """The custom task `domain`/`task` seeded with `seed`, as `suite.load` builds a suite
    task; None when the pair is not a custom task."""
    make = _TASKS.get((domain, task))
    if make is None:
        return None
    env = make(seed)
    env.task.visualize_reward = False
    return env

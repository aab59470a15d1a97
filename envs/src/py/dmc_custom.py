"""The custom DMControl tasks of TD-MPC2 (11 in its mt30 task set, 17 more), built on
dm_control's suite.

Walker, cheetah and hopper variants with new rewards, three- and four-link reachers, fish
among pillars, cup spin and pendulum spin, matching the official TD-MPC2 definitions: same models, rewards,
observations, time limits and initial states. This module is embedded in the binary and
loaded from a string, so it reads no files of its own: the models are dm_control's XML,
edited here where the official ones differ.
"""
import xml.etree.ElementTree as ET

import numpy as np
from dm_control.rl import control
from dm_control.suite import (
    ball_in_cup,
    base,
    cheetah,
    common,
    fish,
    hopper,
    pendulum,
    reacher,
    walker,
)
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


# Heights of the official walker's poses: standing tall, lying flat, feet up.
_YOGA_STAND = 1.0
_YOGA_LIE = 0.08
_YOGA_LEGS_UP = 1.1


def _above(value, height):
    return rewards.tolerance(value, bounds=(height, _INF), margin=height / 2)


def _below(value, height):
    return rewards.tolerance(value, bounds=(-_INF, height), margin=height / 2)


class _WalkerPose(walker.PlanarWalker):
    """Hold a pose: `arabesque`, `lie_down`, `legs_up`, or `upside_down` (on its head), the
    last while moving at `move_speed` (signed, along x; 0: in place)."""

    def __init__(self, pose, move_speed=0, random=None):
        super().__init__(0, random=random)
        self._pose = pose
        self._speed = move_speed

    def get_reward(self, physics):
        def z(body):
            return physics.named.data.xpos[body, "z"]

        thighs = (z("left_thigh") + z("right_thigh")) / 2
        feet = (z("left_foot") + z("right_foot")) / 2
        torso = physics.torso_height()
        # 0 upright, 1/2 lying, 1 upside down.
        tipped = (1 - physics.torso_upright()) / 2
        if self._pose == "arabesque":
            # The standing foot's margin is the standing height's, as in the official task.
            left_down = rewards.tolerance(
                z("left_foot"), bounds=(-_INF, _YOGA_LIE), margin=_YOGA_STAND / 2
            )
            standing = 3 * _above(torso, _YOGA_STAND)
            return (standing + left_down + _above(z("right_foot"), _YOGA_STAND) + tipped) / 6
        if self._pose == "lie_down":
            return (3 * _below(torso, _YOGA_LIE) + _below(thighs, _YOGA_LIE) + tipped) / 5
        if self._pose == "legs_up":
            up = 3 * _below(torso, _YOGA_LIE) + 2 * _above(feet, _YOGA_LEGS_UP)
            return (up + _below(thighs, _YOGA_LIE) + tipped) / 7
        on_head = (3 * _above(feet, _YOGA_LEGS_UP) + 2 * _above(thighs, _YOGA_STAND)) / 5
        if self._speed == 0:
            return on_head
        bounds = (self._speed, _INF) if self._speed > 0 else (-_INF, self._speed)
        moving = rewards.tolerance(
            physics.horizontal_velocity(),
            bounds=bounds,
            margin=abs(self._speed) / 2,
            value_at_margin=0.5,
            sigmoid="linear",
        )
        return on_head * (5 * moving + 1) / 6


def _walker(task):
    xml = _edit_model(walker.get_model_and_assets()[0], _lengthen_plane("floor", "500"))
    physics = walker.Physics.from_xml_string(xml, common.ASSETS)
    return control.Environment(
        physics,
        task,
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


class _CheetahStand(cheetah.Cheetah):
    """Rear up, the torso and the `raised` feet high, while staying (nearly) in place; with
    both feet named, either pair in turn counts half."""

    # Horizontal speed (either way) below which the cheetah counts as in place.
    _MAX_SPEED = 0.5

    def __init__(self, raised, random=None):
        super().__init__(random=random)
        self._raised = raised

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
        stands = [self._stand_on_one_pair(physics, raised) for raised in self._raised]
        return sum(stands) / len(stands)


# Height below which a body part counts as on the ground.
_CHEETAH_DOWN = 0.25


class _CheetahLieDown(cheetah.Cheetah):
    """Lie flat: torso and feet low."""

    def get_reward(self, physics):
        xpos = physics.named.data.xpos
        feet = (xpos["ffoot", "z"] + xpos["bfoot", "z"]) / 2
        low = lambda height: rewards.tolerance(
            height, bounds=(-_INF, _CHEETAH_DOWN), margin=_CHEETAH_DOWN,
            value_at_margin=0, sigmoid="linear",
        )
        return (3 * low(xpos["torso", "z"]) + low(feet)) / 4


class _CheetahLegsUp(cheetah.Cheetah):
    """Torso low, back foot raised (as run-front scores it, standing still)."""

    def get_reward(self, physics):
        xpos = physics.named.data.xpos
        torso_down = rewards.tolerance(
            xpos["torso", "z"], bounds=(-_INF, _CHEETAH_DOWN), margin=_CHEETAH_DOWN / 2
        )
        raised = (3 * _cheetah_up(xpos["bfoot", "z"]) + 2 * _cheetah_up(xpos["torso", "z"])) / 5
        return (5 * torso_down + raised) / 6


def _angular_momentum(physics):
    """The torso subtree's angular momentum about y (the plane's normal)."""
    return physics.named.data.subtree_angmom["torso"][1]


# Angular momentum above which the cheetah's flip reward is full.
_CHEETAH_SPIN = 8


class _CheetahFlip(cheetah.Cheetah):
    """Somersault forwards (`direction` 1) or backwards (-1) while moving that way at `speed`."""

    def __init__(self, direction, speed, random=None):
        super().__init__(random=random)
        self._direction = direction
        self._speed = speed

    def get_reward(self, physics):
        spin = _at_least(self._direction * _angular_momentum(physics), _CHEETAH_SPIN)
        moving = _at_least(self._direction * physics.speed(), self._speed)
        return (2 * spin + moving) / 3


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


# Angular momentum above which the hopper's flip reward is full.
_HOPPER_SPIN = 5


class _HopperFlip(hopper.Hopper):
    """Spin forwards (`direction` 1) or backwards (-1)."""

    def __init__(self, direction, random=None):
        super().__init__(hopping=None, random=random)
        self._direction = direction

    def get_reward(self, physics):
        return rewards.tolerance(
            self._direction * _angular_momentum(physics),
            bounds=(_HOPPER_SPIN, _INF),
            margin=_HOPPER_SPIN / 2,
            value_at_margin=0,
            sigmoid="linear",
        )


def _hopper(task):
    physics = hopper.Physics.from_xml_string(*hopper.get_model_and_assets())
    return control.Environment(physics, task, time_limit=20, control_timestep=0.02)


# Reacher with three or four links.

# Per arm: body and geom name, joint name, capsule length, joint range (None: unlimited),
# from the shoulder out, and how far each body, the finger included, sits from its parent.
_REACHER_ARMS = {
    3: (
        (
            ("arm0", "shoulder0", "0.09", None),
            ("arm1", "shoulder1", "0.09", "-80 80"),
            ("hand", "wrist", "0.1", "-80 80"),
        ),
        ".09 0 0",
    ),
    4: (
        (
            ("arm0", "shoulder0", "0.06", None),
            ("arm1", "shoulder1", "0.06", "-80 80"),
            ("arm2", "shoulder2", "0.06", "-80 80"),
            ("hand", "wrist", "0.1", "-80 80"),
        ),
        ".06 0 0",
    ),
}


def _reacher_links(count):
    """An edit that replaces dm_control's two-link arm, where it stands, with `count` links
    and their motors."""
    links, spacing = _REACHER_ARMS[count]

    def edit(root):
        world = root.find("worldbody")
        arm = world.find("body[@name='arm']")
        finger = arm.find(".//body[@name='finger']")
        index = list(world).index(arm)
        world.remove(arm)

        parent = None
        for name, joint, length, limits in links:
            pos = arm.get("pos") if parent is None else spacing
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
        finger.set("pos", spacing)
        parent.append(finger)

        actuators = root.find("actuator")
        for motor in list(actuators):
            actuators.remove(motor)
        for _, joint, _, _ in links:
            ET.SubElement(actuators, "motor", name=joint, joint=joint)

    return edit


def _reacher(links, target_size, random):
    xml = _edit_model(reacher.get_model_and_assets()[0], _reacher_links(links))
    physics = reacher.Physics.from_xml_string(xml, common.ASSETS)
    task = reacher.Reacher(target_size=target_size, random=random)
    return control.Environment(physics, task, time_limit=20)


# Fish among four pillars.

# Centres (x, y) of the pillars, boxes of half-size 0.05 x 0.05 x 0.1 standing on the floor.
_FISH_PILLARS = ((-0.15, -0.15), (0.15, -0.15), (0.15, 0.15), (-0.15, 0.15))


def _add_pillars(root):
    """Adds the pillars (geoms `wall0`..`wall3`) right after the ground."""
    defaults = root.find("default")
    wall = ET.SubElement(defaults, "default", {"class": "wall"})
    ET.SubElement(wall, "geom", type="box", material="self")
    world = root.find("worldbody")
    ground = list(world).index(world.find("geom[@name='ground']"))
    for i, (x, y) in enumerate(_FISH_PILLARS):
        pillar = ET.Element(
            "geom", {"name": f"wall{i}", "class": "wall", "pos": f"{x} {y} .1", "size": ".05 .05 .1"}
        )
        world.insert(ground + 1 + i, pillar)


class _FishObstacles(fish.Swim):
    """Swim to the target, which is never placed by a pillar, without touching one."""

    @staticmethod
    def _by_a_pillar(physics, geom, distance):
        """Whether `geom` is within `distance` of a pillar's centre along x or along y."""
        xy = physics.named.data.geom_xpos[geom][:2]
        return any(
            np.min(np.abs(xy - physics.named.data.geom_xpos[f"wall{i}"][:2])) < distance
            for i in range(len(_FISH_PILLARS))
        )

    def initialize_episode(self, physics):
        while True:
            quat = self.random.randn(4)
            physics.named.data.qpos["root"][3:7] = quat / np.linalg.norm(quat)
            for joint in fish._JOINTS:
                physics.named.data.qpos[joint] = self.random.uniform(-0.2, 0.2)
            geom_pos = physics.named.model.geom_pos
            geom_pos["target", "x"] = self.random.uniform(-0.4, 0.4)
            geom_pos["target", "y"] = self.random.uniform(-0.4, 0.4)
            geom_pos["target", "z"] = self.random.uniform(0.1, 0.3)
            physics.after_reset()
            if not self._by_a_pillar(physics, "target", 0.08):
                break
        base.Task.initialize_episode(self, physics)

    def get_reward(self, physics):
        clear = 1.0 - self._by_a_pillar(physics, "torso", 0.06)
        return clear * super().get_reward(physics)


def _fish_obstacles(random):
    xml = _edit_model(fish.get_model_and_assets()[0], _add_pillars)
    physics = fish.Physics.from_xml_string(xml, common.ASSETS)
    return control.Environment(
        physics, _FishObstacles(random=random), control_timestep=0.04, time_limit=40
    )


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


_RUN = cheetah._RUN_SPEED
_TASKS = {
    ("walker", "walk_backwards"): lambda random: _walker(
        _WalkerBackwards(walker._WALK_SPEED, random=random)
    ),
    ("walker", "run_backwards"): lambda random: _walker(
        _WalkerBackwards(walker._RUN_SPEED, random=random)
    ),
    ("walker", "arabesque"): lambda random: _walker(_WalkerPose("arabesque", random=random)),
    ("walker", "lie_down"): lambda random: _walker(_WalkerPose("lie_down", random=random)),
    ("walker", "legs_up"): lambda random: _walker(_WalkerPose("legs_up", random=random)),
    ("walker", "headstand"): lambda random: _walker(_WalkerPose("upside_down", random=random)),
    ("walker", "flip"): lambda random: _walker(
        _WalkerPose("upside_down", walker._RUN_SPEED * 0.75, random=random)
    ),
    ("walker", "backflip"): lambda random: _walker(
        _WalkerPose("upside_down", -walker._RUN_SPEED * 0.75, random=random)
    ),
    ("cheetah", "run_backwards"): lambda random: _cheetah(
        _CheetahBackwards(_RUN * 0.8, random=random)
    ),
    ("cheetah", "run_front"): lambda random: _cheetah(
        _CheetahOneFoot("bfoot", _RUN * 0.6, random=random)
    ),
    ("cheetah", "run_back"): lambda random: _cheetah(
        _CheetahOneFoot("ffoot", _RUN * 0.6, random=random)
    ),
    ("cheetah", "jump"): lambda random: _cheetah(_CheetahStand(("bfoot", "ffoot"), random)),
    ("cheetah", "stand_front"): lambda random: _cheetah(_CheetahStand(("bfoot",), random)),
    ("cheetah", "stand_back"): lambda random: _cheetah(_CheetahStand(("ffoot",), random)),
    ("cheetah", "lie_down"): lambda random: _cheetah(_CheetahLieDown(random=random)),
    ("cheetah", "legs_up"): lambda random: _cheetah(_CheetahLegsUp(random=random)),
    ("cheetah", "flip"): lambda random: _cheetah(_CheetahFlip(1, _RUN, random=random)),
    ("cheetah", "flip_backwards"): lambda random: _cheetah(
        _CheetahFlip(-1, _RUN * 0.8, random=random)
    ),
    ("hopper", "hop_backwards"): lambda random: _hopper(_HopperBackwards(random=random)),
    ("hopper", "flip"): lambda random: _hopper(_HopperFlip(1, random=random)),
    ("hopper", "flip_backwards"): lambda random: _hopper(_HopperFlip(-1, random=random)),
    ("reacher", "three_easy"): lambda random: _reacher(3, 0.05, random),
    ("reacher", "three_hard"): lambda random: _reacher(3, 0.015, random),
    ("reacher", "four_easy"): lambda random: _reacher(4, 0.05, random),
    ("reacher", "four_hard"): lambda random: _reacher(4, 0.015, random),
    ("fish", "obstacles"): _fish_obstacles,
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

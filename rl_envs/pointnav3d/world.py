"""The MiniWorld scene of a 3D PointNav floorplan (OpenGL through EGL, no display).

Importing this module sets pyglet's headless mode (EGL, before any pyglet window or GL import),
then imports MiniWorld, which creates pyglet's shadow GL context. It fails with an ``ImportError``
or a pyglet exception where EGL is missing; :mod:`rl_envs.pointnav3d.env` imports it lazily and
turns that into a clear error.

Mesa's CPU rasteriser (llvmpipe) renders with a pool of threads, one per core, by default. Here
every sampler or collection-worker process renders its own environments and the cores are already
shared out between processes, so the pool only adds hand-offs between threads:
``LP_NUM_THREADS=0`` (render in the calling thread), set here unless the environment already sets
it, made training 1.07x faster on 2 cores (``dagger_ppo_nav3d``; docs/tasks/nav3d.md). A GPU
driver ignores the variable.

:class:`SceneWorld` is a ``MiniWorldEnv`` used as a scene: the task builds its rooms from a
:class:`~rl_envs.pointnav3d.layout.Floorplan`, places the agent, moves it with MiniWorld's own
collision rule and renders its camera. It compiles its static geometry into a display list of its
own: MiniWorld's envs all use display list 1, which the GL contexts of one process share, so a
second env's reset would repaint the first's rooms.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import math
import os
from typing import Any

import numpy as np
import pyglet

pyglet.options["headless"] = True  # before pyglet.gl / pyglet.window are imported
os.environ.setdefault("LP_NUM_THREADS", "0")  # llvmpipe renders in this thread (see above)

from miniworld.miniworld import MiniWorldEnv  # noqa: E402 (needs the option above)
from miniworld.opengl import Texture  # noqa: E402
from miniworld.params import DEFAULT_PARAMS  # noqa: E402
from miniworld.utils import get_file_path  # noqa: E402
from PIL import Image  # noqa: E402
from pyglet import gl  # noqa: E402

from rl_envs.pointnav3d.layout import Floorplan  # noqa: E402

__all__ = ["SceneWorld"]

DOOR_HEIGHT = 2.2  # metres (walls are MiniWorld's 2.74 m)


_LOADED: set[str] = set()


def _load_texture(name: str) -> None:
    """Put texture ``name`` (its first variant) in MiniWorld's per-process texture cache.

    What ``miniworld.opengl.Texture.load`` does, with the PNG decoded by Pillow: pyglet's
    format conversion takes about a second per texture, this a few milliseconds. Its path is
    recorded too: ``Texture.get`` otherwise looks the files up on disk on every call.
    """
    if name in _LOADED:
        return
    path = get_file_path("textures", f"{name}_1", "png")
    Texture.tex_paths[name] = [path]
    if path not in Texture.tex_cache:
        with Image.open(path) as image:
            rgba = np.asarray(image.convert("RGBA"))[::-1]  # GL's rows run bottom to top
        height, width = rgba.shape[:2]
        tex = pyglet.image.Texture.create(width, height)
        gl.glBindTexture(gl.GL_TEXTURE_2D, tex.id)
        data = np.ascontiguousarray(rgba).ctypes.data_as(ctypes.POINTER(gl.GLubyte))
        gl.glTexImage2D(
            gl.GL_TEXTURE_2D, 0, gl.GL_RGB, width, height, 0, gl.GL_RGBA, gl.GL_UNSIGNED_BYTE, data
        )
        gl.glHint(gl.GL_GENERATE_MIPMAP_HINT, gl.GL_NICEST)
        gl.glGenerateMipmap(gl.GL_TEXTURE_2D)
        gl.glTexParameteri(gl.GL_TEXTURE_2D, gl.GL_TEXTURE_MAG_FILTER, gl.GL_LINEAR)
        gl.glTexParameteri(gl.GL_TEXTURE_2D, gl.GL_TEXTURE_MIN_FILTER, gl.GL_LINEAR_MIPMAP_LINEAR)
        gl.glBindTexture(gl.GL_TEXTURE_2D, 0)
        Texture.tex_cache[path] = Texture(tex, name)
    _LOADED.add(name)


class SceneWorld(MiniWorldEnv):
    """A MiniWorld scene built from a floorplan (see the module docstring)."""

    def __init__(
        self,
        *,
        width: int,
        height: int,
        forward_step: float,
        turn_degrees: float,
        radius: float,
    ) -> None:
        """Create the GL context and frame buffers for ``width x height`` camera images.

        Args:
            width: Camera image width, pixels.
            height: Camera image height, pixels.
            forward_step: Forward step length, metres.
            turn_degrees: Turn angle, degrees.
            radius: The agent's collision radius, metres.
        """
        params = DEFAULT_PARAMS.no_random()
        params.set("forward_step", forward_step)
        params.set("turn_step", turn_degrees)
        self._list_id = 0
        self._radius = float(radius)
        # MiniWorldEnv.__init__ resets once (building a scene); give it a one-room plan.
        self._plan = Floorplan((3.0,), (3.0,), (), (("concrete", "floor_tiles_bw", "white"),))
        self._start: tuple[np.ndarray, float] = (np.array([1.5, 1.5]), 0.0)
        # MiniWorld prints "Falling back to num_samples=..." per frame buffer; keep stdout clean.
        with contextlib.redirect_stdout(io.StringIO()):
            super().__init__(
                max_episode_steps=1 << 30,
                obs_width=width,
                obs_height=height,
                window_width=max(width, 64),
                window_height=max(height, 64),
                params=params,
                domain_rand=False,
            )

    def build(self, plan: Floorplan, start: np.ndarray, heading: float) -> np.ndarray:
        """Build ``plan``'s rooms, put the agent at ``start (x, z)`` facing ``heading``.

        Returns:
            The first camera image ``[H, W, 3]`` uint8.
        """
        self._plan = plan
        self._start = (np.asarray(start, dtype=np.float64), float(heading))
        obs, _ = self.reset()
        return obs

    def place(self, start: np.ndarray, heading: float) -> np.ndarray:
        """Move the agent to ``start (x, z)`` facing ``heading`` in the scene already built.

        A new episode on the same floorplan: no rooms, static data or display list rebuilt.

        Returns:
            The first camera image ``[H, W, 3]`` uint8.
        """
        self._start = (np.asarray(start, dtype=np.float64), float(heading))
        self.step_count = 0
        self.agent.pos = np.array([float(start[0]), 0.0, float(start[1])])
        self.agent.dir = float(heading)
        return self.render_obs()

    def _gen_world(self) -> None:
        plan = self._plan
        rooms = []
        self.shadow_window.switch_to()
        for names in plan.textures:
            for name in names:
                _load_texture(name)
        for r in range(plan.rows * plan.cols):
            min_x, max_x, min_z, max_z = plan.room_rect(r)
            wall, floor, ceiling = plan.textures[r]
            rooms.append(
                self.add_rect_room(
                    min_x=min_x,
                    max_x=max_x,
                    min_z=min_z,
                    max_z=max_z,
                    wall_tex=wall,
                    floor_tex=floor,
                    ceil_tex=ceiling,
                )
            )
        for door in plan.doors:
            if door.b == door.a + 1:  # east neighbour: the opening runs along z
                self.connect_rooms(
                    rooms[door.a], rooms[door.b], min_z=door.lo, max_z=door.hi, max_y=DOOR_HEIGHT
                )
            else:
                self.connect_rooms(
                    rooms[door.a], rooms[door.b], min_x=door.lo, max_x=door.hi, max_y=DOOR_HEIGHT
                )
        (x, z), heading = self._start
        self.agent.radius = self._radius  # MiniWorld's Agent fixes 0.4; bot_radius is unused
        self.place_agent(pos=np.array([x, 0.0, z]), dir=heading)

    def position(self) -> np.ndarray:
        """The agent's ``(x, z)``."""
        return np.array([self.agent.pos[0], self.agent.pos[2]])

    def heading(self) -> float:
        """The agent's direction, radians, wrapped to ``(-pi, pi]``."""
        d = float(self.agent.dir)
        return math.atan2(math.sin(d), math.cos(d))

    def depth(self) -> np.ndarray:
        """Depth (metres) of the last camera image, ``[H, W, 1]`` float32."""
        return self.obs_fb.get_depth_map(0.04, 100.0)

    # A display list of this scene's own (MiniWorld's envs all compile into list 1).
    def _render_static(self) -> None:
        if not self._list_id:
            self._list_id = int(gl.glGenLists(1))
        gl.glNewList(self._list_id, gl.GL_COMPILE)
        gl.glLightfv(gl.GL_LIGHT0, gl.GL_POSITION, (gl.GLfloat * 4)(*self.light_pos, 1))
        gl.glLightfv(gl.GL_LIGHT0, gl.GL_AMBIENT, (gl.GLfloat * 4)(*self.light_ambient))
        gl.glLightfv(gl.GL_LIGHT0, gl.GL_DIFFUSE, (gl.GLfloat * 4)(*self.light_color))
        gl.glEnable(gl.GL_LIGHTING)
        gl.glEnable(gl.GL_LIGHT0)
        gl.glShadeModel(gl.GL_SMOOTH)
        gl.glEnable(gl.GL_COLOR_MATERIAL)
        gl.glColorMaterial(gl.GL_FRONT_AND_BACK, gl.GL_AMBIENT_AND_DIFFUSE)
        gl.glEnable(gl.GL_TEXTURE_2D)
        for room in self.rooms:
            room._render()
        for ent in self.entities:
            if ent.is_static:
                ent.render()
        gl.glEndList()

    def _render_world(self, frame_buffer: Any, render_agent: bool) -> np.ndarray:
        gl.glCallList(self._list_id)
        for ent in self.entities:
            if not ent.is_static and ent is not self.agent:
                ent.render()
        if render_agent:
            self.agent.render()
        return frame_buffer.resolve()

    def close(self) -> None:
        """Free the display list (the GL context lives as long as the process)."""
        if self._list_id:
            self.shadow_window.switch_to()
            gl.glDeleteLists(self._list_id, 1)
            self._list_id = 0
        super().close()

"""A stand-in for gym in benchmarks/run_scripts.py: CartPole-v1 with the gym>=0.26 API
(reset -> (obs, info), step -> (obs, reward, terminated, truncated, info)), numpy only."""

import math

import numpy as np


class _Box:
    def __init__(self, shape, low=-1.0, high=1.0):
        self.shape = shape
        self.low = np.full(shape, low, dtype=np.float32)
        self.high = np.full(shape, high, dtype=np.float32)


class _Discrete:
    def __init__(self, n):
        self.n = n
        self.shape = ()

    def sample(self):
        return int(np.random.randint(self.n))


class CartPole:
    def __init__(self):
        self.observation_space = _Box((4,))
        self.action_space = _Discrete(2)
        self.rng = np.random.default_rng(0)
        self.state = None
        self.t = 0

    def reset(self, seed=None, options=None):
        self.state = self.rng.uniform(-0.05, 0.05, size=4)
        self.t = 0
        return self.state.astype(np.float32), {}

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + 0.05 * theta_dot**2 * sin) / 1.1
        theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos / 1.1
        self.state = np.array(
            [
                x + 0.02 * x_dot,
                x_dot + 0.02 * x_acc,
                theta + 0.02 * theta_dot,
                theta_dot + 0.02 * theta_acc,
            ]
        )
        self.t += 1
        done = bool(abs(self.state[0]) > 2.4 or abs(self.state[2]) > 0.21)
        return self.state.astype(np.float32), 1.0, done, self.t >= 500, {}

    def render(self, *args, **kwargs):
        return None

    def close(self):
        return None


def make(env_id, *args, **kwargs):
    if env_id.startswith("CartPole"):
        return CartPole()
    raise ValueError(f"the run shim's gym has CartPole only, not {env_id}")

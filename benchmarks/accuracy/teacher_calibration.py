"""Calibrates the teacher workload: SyncAverage's step time and time to a test accuracy.

    horovodrun -np 2 -H node1:1,node2:1 --mpi python -m benchmarks.accuracy.teacher_calibration --out r.json

Every rank trains ``student_mlp`` on ``--data teacher`` with SyncAverage (SGD,
momentum 0.9, ``--batch`` per rank, 256 by default) and evaluates the test set every
``--eval-steps`` steps (the evaluation's time is left out of the training
clock). It stops at ``--target`` or after ``--cap`` seconds of training. At
np = 1 the step time is the compute alone: the comm fraction of a run at np = 2
is 1 - compute / step.
"""
import argparse
import json
import time

import keras
import numpy as np

import hvd_easgd
from hvd_easgd.app import data, models


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=256, help="per rank")
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--cap", type=float, default=240.0)
    parser.add_argument("--eval-steps", type=int, default=50)
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    comm = hvd_easgd.init(threads_per_rank=1)
    d = data.teacher()
    keras.utils.set_random_seed(args.seed)
    model = models.build("student_mlp", d.input_shape, d.num_classes)
    model.compile(optimizer=hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9),
                                                           strategy=hvd_easgd.SyncAverage()),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    clock = {"train": 0.0, "steps": 0, "curve": [], "step_seconds": []}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            dt = time.perf_counter() - self.t
            clock["train"] += dt
            clock["steps"] += 1
            clock["step_seconds"].append(dt)
            if clock["steps"] % args.eval_steps == 0:
                acc = float(self.model.evaluate(d.x_test, d.y_test, batch_size=1000, verbose=0)[1])
                clock["curve"].append([clock["steps"], clock["train"], acc])
                if comm.rank == 0:
                    print(f"step {clock['steps']} train {clock['train']:.1f} s acc {acc:.4f}", flush=True)
                if acc >= args.target or clock["train"] > args.cap or clock["steps"] >= args.max_steps:
                    self.model.stop_training = True

    rng = np.random.default_rng(args.seed)
    index = rng.permutation(len(d.y_train))[comm.rank::comm.size]
    model.fit(d.x_train[index], d.y_train[index], batch_size=args.batch, epochs=1000, shuffle=True, verbose=0,
              callbacks=hvd_easgd.callbacks.defaults() + [Clock()])
    if comm.rank == 0:
        steady = clock["step_seconds"][5:]
        reached = next((c for c in clock["curve"] if c[2] >= args.target), None)
        result = {"np": comm.size, "steps": clock["steps"], "median_step_seconds": float(np.median(steady)),
                  "target": args.target, "reached": reached, "curve": clock["curve"]}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps({k: v for k, v in result.items() if k != "curve"}), flush=True)


if __name__ == "__main__":
    main()

"""The first import of every ``TensorflowTrainer`` worker process (``TensorflowTrainer._preload_modules``).

Importing this module sets ``TF_USE_LEGACY_KERAS=1`` and imports TensorFlow and tf-keras (about 5 s),
while the driver is still setting the run up, and in the standby processes that replace failed
workers; so neither the train loop nor a restart waits for the import. Unlike every other trainforge
module, its import changes the environment: that is its purpose, and it does so only in a trainforge
worker process (see :func:`trainforge.tensorflow.env.preload`). Import it nowhere else.
"""

from trainforge.tensorflow.env import preload

preload()

"""Runtime: tasks, channels, the coordinator's network side, the driver and launchers.

Only :mod:`epochal.runtime.spark` imports pyspark.
"""

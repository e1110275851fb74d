"""airflow-rover's UI plugin, for a deployment's plugins folder.

An installed airflow-rover registers the plugin through its ``airflow.plugins`` entry point
already; drop this file into ``[core] plugins_folder`` where it is on the PYTHONPATH without
being installed (an image that copies the source). Use one or the other, not both.
"""

from airflow_rover.plugins.rover_plugin import RoverPlugin

__all__ = ["RoverPlugin"]

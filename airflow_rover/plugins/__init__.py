"""The Airflow UI plugin: the elastic jobs pages (``ui_app``) and what it registers
(``rover_plugin``)."""

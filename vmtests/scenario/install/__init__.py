"""Taking a machine to a profile's serving configuration: the switching protocol, the reference
guest's switch and the units it installs (``vmtests.scenario`` says how the groups fit)."""

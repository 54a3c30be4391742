# Serving profile: the state before serve issue #52, i.e. the module's defaults with none of the
# validated features. The VM test's base host runs it, so that a switch to cfx-llm2 and a reboot
# visibly change every flag, variable and banner. Not for production.
{ }

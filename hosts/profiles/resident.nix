# Serving profile: cfx-llm2 plus Phase 2a device-resident decode (Option A of serve issue #52).
#
# Why this is a separate profile and not the production default (owner's advisory, 2026-09-24):
# - there is no valid measurement of resident decode's effect: the 48.51 ms figure came from a
#   26-token prompt with degenerate output; the valid B=1 control (48.619 ms) is without it;
# - resident decode's value is async decode, which prefix caching disables (prefix sidecars
#   require synchronous local execution), so under prefix caching it adds cost and correctness
#   surface for at most its sync-mode benefit;
# - it forces on-device argmax (the module asserts deviceResident -> deviceArgmax), and
#   argmax + prefix caching failed 1 of 32 concurrent requests once.
# Gate before switching cfx-llm2 to it: an interleaved A/B of deviceResident on vs off, both arms
# with prefix caching, at concurrency 8 with a realistic prompt and sha/banner checks (ship
# without it if the delta is inside the ~0.5 % noise band), and >= 8 x 32 = 256 concurrent
# requests without a failure on exactly this configuration.
(import ./cfx-llm2.nix)
// {
  deviceResident = true;
  deviceArgmax = true;
}

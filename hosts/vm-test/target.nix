# A VM test target: the production host (../cfx-llm2/host.nix) running one serving profile, with
# its hardware file and device layer replaced by the VM and the stub (./common.nix), e.g.
# `import ./target.nix ../profiles/cfx-llm2.nix`. Its toplevel is what the test switches to.
servingProfile:
{ ... }:
{
  imports = [
    (import ../cfx-llm2/host.nix { inherit servingProfile; })
    ./common.nix
  ];
}

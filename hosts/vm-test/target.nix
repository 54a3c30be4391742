# A VM test target: the same VM as base.nix running one serving profile unchanged, e.g.
# `import ./target.nix ../profiles/cfx-llm2.nix`. Its toplevel is what the test switches to.
servingProfile:
{ ... }:
{
  imports = [ ./common.nix ];

  services.tenstorrent-serving = import servingProfile // {
    enable = true;
  };
}

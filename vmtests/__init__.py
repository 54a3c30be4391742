"""vmtests: prove that Tenstorrent serving settings survive ``nixos-rebuild switch`` and reboot."""

__version__ = "0.1.0"

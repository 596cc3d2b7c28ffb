# CPack configuration: filled in by the packaging work (see installer/README).

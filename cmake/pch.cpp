// Empty translation unit that carries the shared precompiled header (see flowtrain.cmake).

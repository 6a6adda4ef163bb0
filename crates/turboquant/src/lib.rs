//! TurboQuant: a vector codec (random rotation + Lloyd–Max scalar codebook + exact bit packing)
//! with kernels that score and accumulate directly on the compressed codes.

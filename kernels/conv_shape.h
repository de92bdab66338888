/* conv_shape.h: the convolution kernels' shape and stride arguments, in the solvers' order
 * (runtime/primitives/convolution/solvers/common.py's shape_args): N, C, H, W, K, Ho, Wo, the
 * filter Y x X, padding, stride and dilation (height, width each), groups G, then x's, w's
 * and y's element strides for (n, c, h, w). A plain macro: CUDA, HIP and OpenCL kernels alike. */
#ifndef CONV_SHAPE_H
#define CONV_SHAPE_H
#define CONV_SHAPE_ARGS                                                                                      \
    int N, int C, int H, int W, int K, int Ho, int Wo, int Y, int X, int ph, int pw, int sh, int sw, int dlh,  \
        int dlw, int G, int xs0, int xs1, int xs2, int xs3, int ws0, int ws1, int ws2, int ws3, int ys0, int ys1, \
        int ys2, int ys3
#endif /* CONV_SHAPE_H */

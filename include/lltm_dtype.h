/* The one place the element types are instantiated: LLTM_TYPED_CALL runs
 * `function` for float or double by the lltm_dtype `dtype`, its pointer
 * arguments passed as void pointers. In C, `function` names a family
 * function_float / function_double; in CUDA C++, a template function<Dtype>.
 * The shim refuses any other dtype before a pass is reached. */
#ifndef LLTM_DTYPE_H
#define LLTM_DTYPE_H

#ifdef __cplusplus
#define LLTM_TYPED_CALL(dtype, function, ...) \
  ((dtype) == LLTM_FLOAT64 ? function<double>(__VA_ARGS__) : function<float>(__VA_ARGS__))
#else
#define LLTM_TYPED_CALL(dtype, function, ...) \
  ((dtype) == LLTM_FLOAT64 ? function##_double(__VA_ARGS__) : function##_float(__VA_ARGS__))
#endif

#endif /* LLTM_DTYPE_H */

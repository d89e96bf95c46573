//! Sample values of every type that travels, for the golden-byte tests: each message of a
//! table is encoded with its fields' samples and the bytes are compared with the pinned ones
//! (crates/protocol/tests/golden.rs). Samples are distinctive (no zeros, where a default would
//! hide a field) and every variant of an enum has one ([`Sample::variants`]).

/// A value to encode in the golden-byte tests.
pub trait Sample: Sized {
    fn sample() -> Self;

    /// One value of each variant (enums), then the sample again with each field of a struct
    /// (or of a variant with named fields) in turn taking each further value of its own
    /// `variants`: every variant of every type inside reaches the wire. The sample otherwise.
    fn variants() -> Vec<Self> {
        vec![Self::sample()]
    }
}

/// A value made by `make` again for each further variant (past the first) of the field that
/// `field` picks out of it (`None`: the value has no such field), that field set to it: how the
/// macros vary one field at a time without naming its type.
pub fn with_each_further<T, F: Sample>(
    make: impl Fn() -> T,
    field: impl Fn(&mut T) -> Option<&mut F>,
) -> Vec<T> {
    F::variants()
        .into_iter()
        .skip(1)
        .filter_map(|value| {
            let mut one = make();
            *field(&mut one)? = value;
            Some(one)
        })
        .collect()
}

macro_rules! sample_numbers {
    ($($ty:ty = $value:expr),* $(,)?) => {
        $(impl Sample for $ty {
            fn sample() -> Self {
                $value
            }
        })*
    };
}

sample_numbers!(
    u8 = 0xa5,
    u16 = 0x1234,
    u32 = 300,
    i32 = -7,
    u64 = 1 << 40,
    i64 = -(1 << 33)
);
sample_numbers!(f32 = 1.5, bool = true);

impl Sample for String {
    fn sample() -> Self {
        "rgpu".into()
    }
}

impl<T: Sample> Sample for Vec<T> {
    fn sample() -> Self {
        T::variants()
    }
}

impl<T: Sample> Sample for Option<T> {
    fn sample() -> Self {
        Some(T::sample())
    }

    fn variants() -> Vec<Self> {
        vec![Some(T::sample()), None]
    }
}

impl<T: Sample, E: Sample> Sample for Result<T, E> {
    fn sample() -> Self {
        Ok(T::sample())
    }

    fn variants() -> Vec<Self> {
        vec![Ok(T::sample()), Err(E::sample())]
    }
}

impl<T: Sample + Copy, const N: usize> Sample for [T; N] {
    fn sample() -> Self {
        [T::sample(); N]
    }
}

impl<A: Sample, B: Sample> Sample for (A, B) {
    fn sample() -> Self {
        (A::sample(), B::sample())
    }
}

impl Sample for () {
    fn sample() -> Self {}
}

/// `Sample` for a struct from its fields' samples; its `variants` vary one field at a time.
macro_rules! sample_struct {
    ($($ty:path { $($field:ident),* $(,)? }),* $(,)?) => {
        $(impl $crate::sample::Sample for $ty {
            fn sample() -> Self {
                Self { $($field: $crate::sample::Sample::sample()),* }
            }

            fn variants() -> Vec<Self> {
                let mut all = vec![Self::sample()];
                $(
                    all.extend($crate::sample::with_each_further(Self::sample, |one: &mut Self| {
                        Some(&mut one.$field)
                    }));
                )*
                all
            }
        })*
    };
}

/// `Sample` for an enum: the first variant listed is the sample, and every variant must be
/// listed (an exhaustive match in the expansion does not compile otherwise). Its `variants`
/// are one value of each variant, then each named field of a variant through its own further
/// variants (fields of tuple variants are left at their samples).
macro_rules! sample_enum {
    ($ty:ident {
        $($variant:ident $({ $($field:ident),* $(,)? })? $(( $($tuple:ident),* ))?),* $(,)?
    }) => {
        impl $crate::sample::Sample for $ty {
            fn sample() -> Self {
                Self::variants().remove(0)
            }

            fn variants() -> Vec<Self> {
                // A match without a wildcard: a variant added to the enum but not here does
                // not compile.
                let _listed = |value: &$ty| match value {
                    $($ty::$variant { .. } => (),)*
                };
                let plain = || vec![$(
                    sample_enum!(@one $ty $variant $({ $($field),* })? $(( $($tuple),* ))?),
                )*];
                // Enums without named fields push nothing more.
                #[allow(unused_mut)]
                let mut all = plain();
                // Then each named field of a variant through its further values.
                $($($(
                    let of_variant = || {
                        plain()
                            .into_iter()
                            .find(|v| matches!(v, $ty::$variant { .. }))
                            .expect("every variant has a sample")
                    };
                    all.extend($crate::sample::with_each_further(of_variant, |one: &mut $ty| {
                        match one {
                            $ty::$variant { $field, .. } => Some($field),
                            #[allow(unreachable_patterns)]
                            _ => None,
                        }
                    }));
                )*)?)*
                all
            }
        }
    };
    (@one $ty:ident $variant:ident { $($field:ident),* }) => {
        $ty::$variant { $($field: $crate::sample::Sample::sample()),* }
    };
    (@one $ty:ident $variant:ident ( $($tuple:ident),* )) => {
        $ty::$variant( $({ let $tuple = $crate::sample::Sample::sample(); $tuple }),* )
    };
    (@one $ty:ident $variant:ident) => {
        $ty::$variant
    };
}

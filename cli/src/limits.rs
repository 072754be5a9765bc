//! Process limits a server needs raised before it starts accepting.

/// Raises this process's soft limit on open files to its hard limit, where the platform has such
/// limits. Every client connection and pooled upstream connection holds a file descriptor, and
/// every sealed send under way two (its pipe), and the usual default soft limit (1024) is reached long before the hard one;
/// servers raise it themselves (nginx's `worker_rlimit_nofile`, Go's runtime). Returns the soft
/// limit before and after when it was raised; `None` when it was already at the hard limit or
/// could not be read or changed (the server then runs with what it has).
pub fn raise_open_files_limit() -> Option<(u64, u64)> {
    imp::raise()
}

#[cfg(unix)]
mod imp {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

    pub(super) fn raise() -> Option<(u64, u64)> {
        let limit = getrlimit(Resource::Nofile);
        let before = limit.current?;
        let target = limit.maximum.unwrap_or(u64::MAX);
        if before >= target {
            return None;
        }
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum: limit.maximum,
            },
        )
        .ok()?;
        let after = getrlimit(Resource::Nofile).current?;
        (after > before).then_some((before, after))
    }
}

#[cfg(not(unix))]
mod imp {
    pub(super) fn raise() -> Option<(u64, u64)> {
        None
    }
}

#[cfg(test)]
mod tests {
    #[cfg(unix)]
    #[test]
    fn the_soft_limit_ends_at_the_hard_limit() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let original = getrlimit(Resource::Nofile);
        let (Some(soft), Some(hard)) = (original.current, original.maximum) else {
            return; // unlimited: nothing to raise
        };
        // Lower the soft limit (allowed without privileges) so that there is something to raise.
        let lowered = soft.min(hard).saturating_sub(1).max(64).min(hard);
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(lowered),
                maximum: Some(hard),
            },
        )
        .expect("lowering the soft limit");
        let raised = super::raise_open_files_limit();
        assert_eq!(getrlimit(Resource::Nofile).current, Some(hard));
        if lowered < hard {
            assert_eq!(raised, Some((lowered, hard)));
        }
        assert_eq!(
            super::raise_open_files_limit(),
            None,
            "nothing left to raise"
        );
    }
}
